import Foundation
import ILSCore
import Testing

@testable import ILSQRCode

/// The codes are read back with a real decoder, `zbarimg` (Debian's zbar-tools, installed by deploy/install-deps.sh):
/// what a phone's camera would see, not what this code believes it drew.
@Suite("QR codes of enrollment tokens: libqrencode's matrix, drawn for a terminal and as a PNG, read back by zbarimg")
struct QRMatrixTests {
    private static let uri = EnrollmentURI.uri(
        for: "eyJhbGciOiJFZERTQSIsImtpZCI6ImNhIn0.eyJqdGkiOiI3ZjNjIiwic3ViIjoiaXBhZCIsImV4cCI6MTc5NTAwMDAwMH0."
            + String(repeating: "c2lnbmF0dXJl", count: 7)
    )

    /// What zbarimg reads in the PNG `bytes`, as raw text.
    private static func decode(_ bytes: [UInt8]) throws -> String {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("ils-qr-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let file = directory.appendingPathComponent("code.png")
        try Data(bytes).write(to: file)
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/zbarimg")
        process.arguments = ["--raw", "-q", file.path]
        let output = Pipe()
        process.standardOutput = output
        try process.run()
        let text = output.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        #expect(process.terminationStatus == 0, "zbarimg found no code")
        return String(decoding: text, as: UTF8.self).trimmingCharacters(in: .newlines)
    }

    @Test("the PNG decodes to the enrollment URI, which gives back the token")
    func pngRoundTrip() throws {
        let code = try QRMatrix.encode(Self.uri, level: .medium)
        let read = try Self.decode(code.png())
        #expect(read == Self.uri)
        #expect(try EnrollmentURI.token(from: read) == (try EnrollmentURI.token(from: Self.uri)))
    }

    @Test("the terminal drawing decodes too: its characters turned back into pixels, light as drawn")
    func terminalRoundTrip() throws {
        let code = try QRMatrix.encode(Self.uri, level: .low)
        let lines = code.terminalText().split(separator: "\n").map(Array.init)
        #expect(lines.allSatisfy { $0.count == code.width + 8 })
        // Each character is two modules, upper and lower: the drawn part is light, the blank part dark.
        var modules: [[Bool]] = []
        for line in lines {
            modules.append(line.map { $0 == "█" || $0 == "▀" })
            modules.append(line.map { $0 == "█" || $0 == "▄" })
        }
        let scale = 6
        let rows = modules.flatMap { row in
            let pixels = row.flatMap { light in Array(repeating: light ? UInt8(255) : 0, count: scale) }
            return Array(repeating: pixels, count: scale)
        }
        let png = PNGWriter.greyscale(width: rows[0].count, height: rows.count, rows: rows)
        #expect(try Self.decode(png) == Self.uri)
    }

    @Test("text beyond a QR code's capacity is refused, not truncated")
    func tooLong() {
        #expect(throws: ILSError.self) { try QRMatrix.encode(String(repeating: "a", count: 8000), level: .medium) }
    }

    @Test("the PNG container's checksums match their known answers (RFC 1950, and PNG's CRC-32 check value)")
    func checksums() {
        #expect(PNGWriter.crc32(Array("123456789".utf8)) == 0xCBF4_3926)
        #expect(PNGWriter.adler32(Array("Wikipedia".utf8)) == 0x11E6_0398)
    }
}
