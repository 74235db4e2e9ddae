import Foundation
import ILSCore
import ILSCrypto
import ILSFabric
import ILSGateway
import ILSTesting
import Testing

@Suite("The gateway's own access decision")
struct GatewayPolicyTests {
    let authority = try! CertificateAuthority.create(name: "test CA")

    func certificate(_ name: String, role: IdentityRole) throws -> IdentityCertificate {
        try IdentityCertificate(pem: try TestIdentities.issue(authority, name: name, role: role).certificatePEM)
    }

    @Test("nobody gets in before the controller sent the policy")
    func closedUntilPolicy() throws {
        let policy = GatewayPolicy()
        #expect(
            policy.decide(try certificate("ipad", role: .device), service: "claude-api", hosted: "claude-api")
                != .allow
        )
    }

    @Test("a device with a dialing role gets in; other roles and other services do not")
    func roles() throws {
        let policy = GatewayPolicy()
        policy.update([.device])
        #expect(
            policy.decide(try certificate("ipad", role: .device), service: "claude-api", hosted: "claude-api")
                == .allow
        )
        #expect(
            policy.decide(try certificate("gw", role: .gateway), service: "claude-api", hosted: "claude-api")
                != .allow
        )
        #expect(
            policy.decide(try certificate("ipad", role: .device), service: "other", hosted: "claude-api")
                != .allow
        )
    }

    @Test("a revoked identity is refused even with a valid certificate and a dialing role")
    func revokedRefused() throws {
        let policy = GatewayPolicy()
        policy.update([.device])
        let ipad = try certificate("ipad", role: .device)
        policy.updateRevoked(["id-ipad"])
        guard case .deny(let reason) = policy.decide(ipad, service: "claude-api", hosted: "claude-api") else {
            Issue.record("a revoked identity was let in")
            return
        }
        #expect(reason.contains("revoked"))
        policy.updateRevoked([])
        #expect(policy.decide(ipad, service: "claude-api", hosted: "claude-api") == .allow)
    }

    @Test("a block sent by any controller replica holds until that replica lifts it, whatever the others send")
    func blocksAreUnionedAcrossReplicas() throws {
        let policy = GatewayPolicy()
        policy.update([.device])
        let ipad = try certificate("ipad", role: .device)
        // Replica A blocked it in memory only (its store write failed); replica B's list, sent later, lacks it.
        policy.updateRevoked(["id-ipad"], from: "https://a:8443")
        policy.updateRevoked([], from: "https://b:8443")
        #expect(policy.blocks("id-ipad"))
        #expect(policy.decide(ipad, service: "claude-api", hosted: "claude-api") != .allow)
        policy.updateRevoked([], from: "https://a:8443")
        #expect(!policy.blocks("id-ipad"))
        #expect(policy.decide(ipad, service: "claude-api", hosted: "claude-api") == .allow)
    }
}
