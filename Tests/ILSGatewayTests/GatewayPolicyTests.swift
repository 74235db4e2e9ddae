import Foundation
import ILSCore
import ILSCrypto
import ILSFabric
import ILSGateway
import ILSTesting
import NIOCore
import NIOEmbedded
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

    @Test("with a grant, membership decides, not the role; a controller that sent none leaves the roles to decide")
    func grantDecides() throws {
        let policy = GatewayPolicy()
        policy.update([.device])
        let ipad = try certificate("ipad", role: .device)
        let admin = try certificate("phone-admin", role: .admin)
        #expect(policy.decide(admin, service: "claude-api", hosted: "claude-api", via: "a") != .allow)
        #expect(policy.updateGrant(grant([admin.id]), from: "a", hosted: "claude-api"))
        #expect(policy.decide(admin, service: "claude-api", hosted: "claude-api", via: "a") == .allow)
        #expect(policy.decide(ipad, service: "claude-api", hosted: "claude-api", via: "a") != .allow)
        // Controller b sent no grant (an earlier release): its circuits are decided by the roles.
        #expect(policy.decide(ipad, service: "claude-api", hosted: "claude-api", via: "b") == .allow)
        #expect(policy.decide(admin, service: "claude-api", hosted: "claude-api", via: "b") != .allow)
        // A block still comes first.
        policy.updateRevoked([admin.id], from: "a")
        #expect(policy.decide(admin, service: "claude-api", hosted: "claude-api", via: "a") != .allow)
    }

    @Test(
        "grants are per controller: one that narrows ends the circuits it took away, another's grant does not keep them"
    )
    func grantPerController() throws {
        let policy = GatewayPolicy()
        policy.update([.device])
        let ipad = try certificate("ipad", role: .device)
        let laptop = try certificate("laptop", role: .device)
        #expect(policy.updateGrant(grant([ipad.id, laptop.id]), from: "a", hosted: "claude-api"))
        #expect(policy.updateGrant(grant([ipad.id]), from: "b", hosted: "claude-api"))
        let viaB = try activeChannel()
        let other = try activeChannel()
        policy.track(viaB, identityID: ipad.id, via: "b")
        policy.track(other, identityID: laptop.id, via: "a")
        #expect(policy.liveCircuits == 2)

        // A narrows: the circuit of the identity it dropped ends, whichever controller carried it.
        #expect(policy.updateGrant(grant([laptop.id]), from: "a", hosted: "claude-api"))
        viaB.embeddedEventLoop.run()
        other.embeddedEventLoop.run()
        #expect(!viaB.isActive)
        #expect(other.isActive, "a circuit of an identity A still grants was cut")
        #expect(policy.decide(ipad, service: "claude-api", hosted: "claude-api", via: "a") != .allow)
        #expect(policy.decide(ipad, service: "claude-api", hosted: "claude-api", via: "b") == .allow)

        // A circuit decided before a narrowing and tracked after it is closed at once.
        let late = try activeChannel()
        policy.track(late, identityID: ipad.id, via: "a")
        late.embeddedEventLoop.run()
        #expect(!late.isActive)
        _ = try? other.finish()
    }

    @Test("a grant for another service, too large, or with an id that cannot be one is dropped whole")
    func badGrantsDropped() throws {
        let policy = GatewayPolicy()
        policy.update([.device])
        let ipad = try certificate("ipad", role: .device)
        #expect(policy.updateGrant(grant([ipad.id]), from: "a", hosted: "claude-api"))
        #expect(
            !policy.updateGrant(
                DialGrant(service: "other", policy: "", identities: []),
                from: "a",
                hosted: "claude-api"
            )
        )
        #expect(!policy.updateGrant(grant(["\u{1b}[2J", ipad.id]), from: "a", hosted: "claude-api"))
        #expect(!policy.updateGrant(grant([String(repeating: "a", count: 65)]), from: "a", hosted: "claude-api"))
        let huge = (0...DialGrant.maximumIdentities).map { "id-\($0)" }
        #expect(!policy.updateGrant(grant(huge), from: "a", hosted: "claude-api"))
        // What was in force stays.
        #expect(policy.decide(ipad, service: "claude-api", hosted: "claude-api", via: "a") == .allow)
    }

    private func activeChannel() throws -> EmbeddedChannel {
        let channel = EmbeddedChannel()
        try channel.connect(to: SocketAddress(ipAddress: "127.0.0.1", port: 1)).wait()
        return channel
    }

    private func grant(_ ids: [String]) -> DialGrant {
        DialGrant(service: "claude-api", policy: "test", identities: ids)
    }
}
