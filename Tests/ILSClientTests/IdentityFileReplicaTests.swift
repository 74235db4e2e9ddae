import Foundation
import ILSCore
import Testing

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
}
