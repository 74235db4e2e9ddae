import Foundation
import ILSCore
import ILSCrypto
import Testing

@Suite("SecureFile: room taken before, content after")
struct SecureFileTests {
    private func scratch() throws -> String {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("sf-\(UUID().uuidString)").path
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: false)
        return directory
    }

    private func mode(_ path: String) -> Int? {
        (try? FileManager.default.attributesOfItem(atPath: path)[.posixPermissions] as? Int) ?? nil
    }

    @Test(
        "a reservation holds its bytes in a 0600 temporary file; commit puts the content in place and leaves nothing else"
    )
    func reserveThenCommit() throws {
        let directory = try scratch()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let path = "\(directory)/id.json"
        let reservation = try SecureFile.reserve(path, bytes: 16 * 1024)
        let temporary = try #require(try FileManager.default.contentsOfDirectory(atPath: directory).first)
        #expect(temporary.hasPrefix(".id.json.") && temporary.hasSuffix(".tmp"))
        #expect(mode("\(directory)/\(temporary)") == 0o600)
        #expect((try FileManager.default.attributesOfItem(atPath: "\(directory)/\(temporary)")[.size] as? Int) == 16384)
        #expect(!FileManager.default.fileExists(atPath: path))
        try reservation.commit(Data("short".utf8), overwrite: false)
        #expect(try FileManager.default.contentsOfDirectory(atPath: directory) == ["id.json"])
        #expect(FileManager.default.contents(atPath: path) == Data("short".utf8))
        #expect(mode(path) == 0o600)
    }

    @Test("abandon leaves nothing; commit without overwrite refuses an existing file and leaves it as it was")
    func abandonAndRefuse() throws {
        let directory = try scratch()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let path = "\(directory)/id.json"
        try SecureFile.reserve(path, bytes: 4096).abandon()
        #expect(try FileManager.default.contentsOfDirectory(atPath: directory).isEmpty)
        try SecureFile.write(Data("first".utf8), to: path, overwrite: false)
        let second = try SecureFile.reserve(path, bytes: 4096)
        #expect(throws: ILSError.self) { try second.commit(Data("second".utf8), overwrite: false) }
        #expect(FileManager.default.contents(atPath: path) == Data("first".utf8))
        #expect(try FileManager.default.contentsOfDirectory(atPath: directory) == ["id.json"])
    }
}
