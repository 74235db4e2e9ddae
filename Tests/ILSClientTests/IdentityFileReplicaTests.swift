import Foundation
import ILSClient
import ILSCore
import Testing

#if canImport(Glibc)
import Glibc
#endif

@Suite("The identity file's controller list")
struct IdentityFileReplicaTests {
    static func file(controllers: [String] = []) -> IdentityFile {
        IdentityFile(
            controller: "https://a.example:8443",
            identity: IdentityRecord(
                id: "id-1",
                name: "phone",
                role: .device,
                attributes: [],
                state: .active,
                createdAt: 0
            ),
            certificate: "CERT",
            caCertificate: "CA",
            privateKey: "KEY",
            controllers: controllers
        )
    }

    @Test(
        "a file written before replicas reads with no list and dials its one controller; one without a list is written without the key"
    )
    func fileWithoutList() throws {
        let encoded = try JSONEncoder().encode(Self.file())
        let object = try #require(try JSONSerialization.jsonObject(with: encoded) as? [String: Any])
        #expect(object["controllers"] == nil)
        let decoded = try JSONDecoder().decode(IdentityFile.self, from: encoded)
        #expect(decoded.controllers.isEmpty)
        #expect(decoded.controllerAddresses.map(\.description) == ["https://a.example:8443"])
    }

    @Test(
        "the list round-trips, and the dial order is the controller, then the others once each, invalid ones left out"
    )
    func listOrder() throws {
        let file = Self.file(controllers: [
            "https://a.example:8443", "https://b.example:8443", "not a url", "https://b.example:8443/",
            "https://c.example:9443",
        ])
        let decoded = try JSONDecoder().decode(IdentityFile.self, from: try JSONEncoder().encode(file))
        #expect(decoded.controllers == file.controllers)
        #expect(
            decoded.controllerAddresses.map(\.description) == [
                "https://a.example:8443", "https://b.example:8443", "https://c.example:9443",
            ]
        )
    }

    @Test("a list longer than the cap is cut to it")
    func listCapped() {
        let many = (1...100).map { "https://h\($0).example:8443" }
        #expect(Self.file(controllers: many).controllerAddresses.count == ControllerAddress.maximumReplicas)
    }

    @Test(
        "a learned list is written only into a file that still holds the certificate used, and one this user owns"
    )
    func learningWritesOnlyWhatIsSafe() throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("ils-learn-\(UUID())").path
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let path = "\(directory)/device.json"
        let file = Self.file()
        try IdentityFileIO.write(file, to: path, overwrite: false)
        let cluster = ControllerAddress.replicas(["https://a:8443", "https://b:8443"])
        // Renewed elsewhere meanwhile: the certificate in the file is not the one this process used.
        #expect(!IdentityFileIO.learn(cluster, path: path, certificate: "another certificate"))
        #expect(try IdentityFileIO.read(path).controllers.isEmpty)
        #expect(IdentityFileIO.learn(cluster, path: path, certificate: file.certificate))
        #expect(try IdentityFileIO.read(path).controllers == cluster.map(\.description))
        let mode = try FileManager.default.attributesOfItem(atPath: path)[.posixPermissions] as? NSNumber
        #expect(mode?.intValue == 0o600)
        // Keys this version does not know are kept.
        var raw = try #require(
            try JSONSerialization.jsonObject(with: Data(contentsOf: URL(fileURLWithPath: path))) as? [String: Any]
        )
        raw["writtenBy"] = "a later version"
        raw["controllers"] = []
        try JSONSerialization.data(withJSONObject: raw).write(to: URL(fileURLWithPath: path))
        #expect(IdentityFileIO.learn(cluster, path: path, certificate: file.certificate))
        let kept = try #require(
            try JSONSerialization.jsonObject(with: Data(contentsOf: URL(fileURLWithPath: path))) as? [String: Any]
        )
        #expect(kept["writtenBy"] as? String == "a later version")
        #expect(try IdentityFileIO.read(path).controllers == cluster.map(\.description))
        // The same list again writes nothing.
        #expect(!IdentityFileIO.learn(cluster.reversed(), path: path, certificate: file.certificate))
        // A file of another user (the machine's service account) is left alone.
        if getuid() == 0 {
            #expect(chown(path, 65_534, 65_534) == 0)
            #expect(!IdentityFileIO.learn([cluster[0]], path: path, certificate: file.certificate))
            let owner = try FileManager.default.attributesOfItem(atPath: path)[.ownerAccountID] as? NSNumber
            #expect(owner?.intValue == 65_534)
        }
    }
}
