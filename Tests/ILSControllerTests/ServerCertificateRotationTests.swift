import Foundation
import ILSController
import ILSCore
import Testing

@Suite("Controller TLS certificate rotation")
struct ServerCertificateRotationTests {
    private func withState(_ body: (String) async throws -> Void) async throws {
        let root = FileManager.default.temporaryDirectory.appendingPathComponent("ils-rot-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: root) }
        _ = try await ControllerState.initialize(
            directory: "\(root)/state",
            address: try ControllerAddress(parsing: "https://127.0.0.1:7443"),
            adminOut: "\(root)/admin.json"
        )
        try await body("\(root)/state")
    }

    @Test("rotation issues a new certificate from the same CA and keeps the old one aside, private")
    func rotateKeepsCA() async throws {
        try await withState { directory in
            let before = try ControllerState.Files(directory: directory)
            let after = try ControllerState.rotateServerCertificate(directory: directory, address: nil)
            #expect(after.authority.fingerprint == before.authority.fingerprint)
            #expect(after.address == before.address)
            #expect(after.serverCertificatePEM != before.serverCertificatePEM)
            #expect(after.serverKeyPEM != before.serverKeyPEM)
            let old = try String(contentsOfFile: "\(directory)/server.pem.old", encoding: .utf8)
            #expect(old == before.serverCertificatePEM)
            for name in ["server.key", "server.key.old", "server.pem"] {
                let mode = try FileManager.default.attributesOfItem(atPath: "\(directory)/\(name)")[.posixPermissions]
                #expect(mode as? Int == 0o600, "\(name)")
            }
        }
    }

    @Test("rotation to a new address moves the controller there; the state loads with it")
    func rotateToNewAddress() async throws {
        try await withState { directory in
            let target = try ControllerAddress(parsing: "https://ctl2.example.net:8443")
            _ = try ControllerState.rotateServerCertificate(directory: directory, address: target)
            let loaded = try ControllerState.Files(directory: directory)
            #expect(loaded.address == target)
        }
    }

    @Test("a directory that is not a controller state is refused, and nothing is written")
    func refusesNonState() throws {
        let root = FileManager.default.temporaryDirectory.appendingPathComponent("ils-rot-\(UUID().uuidString)").path
        try FileManager.default.createDirectory(atPath: root, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: root) }
        #expect(throws: ILSError.self) {
            _ = try ControllerState.rotateServerCertificate(directory: root, address: nil)
        }
        #expect(try FileManager.default.contentsOfDirectory(atPath: root).isEmpty)
    }
}
