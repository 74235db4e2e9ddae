import Foundation
import ILSCore
import Testing

/// `ILSError.Code` is one closed set: each code once, with an exit status no other code has, spelled in one file, and
/// listed in docs/operations.md ("Exit statuses") as it is in the code.
@Suite("Error codes: one closed set, each with its own exit status")
struct ILSErrorCodeTests {
    static let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().appendingPathComponent("../..")
        .standardized

    @Test("no two codes share a name or an exit status, and a name finds its code")
    func unique() {
        let codes = ILSError.Code.all
        #expect(Set(codes.map(\.name)).count == codes.count)
        #expect(Set(codes.map(\.exitCode)).count == codes.count, "\(codes.map { "\($0.name)=\($0.exitCode)" })")
        for code in codes { #expect(ILSError.Code(name: code.name) == code) }
        #expect(ILSError.Code(name: "no_such_code") == nil)
        // sysexits' range and ours; 0, 1 and 2 stay for success, ArgumentParser's failures and usage.
        #expect(codes.allSatisfy { (64...99).contains($0.exitCode) })
        #expect(EnrollmentRefusal.allCases.allSatisfy { codes.contains($0.code) })
    }

    @Test("codes are declared in ILSError.swift only: no other source file mints one")
    func declaredOnce() throws {
        let sources = Self.root.appendingPathComponent("Sources")
        let files = FileManager.default.enumerator(at: sources, includingPropertiesForKeys: nil)!
            .compactMap { $0 as? URL }.filter {
                $0.pathExtension == "swift" && $0.lastPathComponent != "ILSError.swift"
            }
        #expect(files.count > 100)
        for file in files {
            let text = try String(contentsOf: file, encoding: .utf8)
            #expect(!text.contains("Code(\""), "\(file.lastPathComponent) mints an error code")
        }
    }

    @Test("docs/operations.md lists every code with its exit status")
    func documented() throws {
        let text = try String(
            contentsOf: Self.root.appendingPathComponent("docs/operations.md"),
            encoding: .utf8
        )
        for code in ILSError.Code.all {
            #expect(text.contains("| `\(code.name)` | \(code.exitCode) |"), "\(code.name) is missing")
        }
    }
}
