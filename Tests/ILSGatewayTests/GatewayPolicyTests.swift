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

    @Test("with a grant, membership decides, not the role; a block still comes first")
    func grantDecides() throws {
        let policy = GatewayPolicy()
        policy.update([.device])
        let ipad = try certificate("ipad", role: .device)
        let admin = try certificate("phone-admin", role: .admin)
        // No controller sent a grant (an earlier release): the roles decide.
        #expect(policy.decide(admin, service: "claude-api", hosted: "claude-api") != .allow)
        #expect(policy.decide(ipad, service: "claude-api", hosted: "claude-api") == .allow)
        #expect(policy.updateGrant(grant([admin.id]), from: "a", hosted: "claude-api"))
        #expect(policy.decide(admin, service: "claude-api", hosted: "claude-api") == .allow)
        #expect(policy.decide(ipad, service: "claude-api", hosted: "claude-api") != .allow)
        policy.updateRevoked([admin.id], from: "a")
        #expect(policy.decide(admin, service: "claude-api", hosted: "claude-api") != .allow)
    }

    @Test(
        "every linked controller's grant must hold the identity: a narrowing from any one ends its circuits and keeps it out, whichever relays"
    )
    func grantsIntersect() throws {
        let policy = GatewayPolicy()
        policy.update([.device])
        let ipad = try certificate("ipad", role: .device)
        let laptop = try certificate("laptop", role: .device)
        // A's feed is stalled: it still grants the laptop, which B (where the admin narrowed) no longer does.
        #expect(policy.updateGrant(grant([ipad.id, laptop.id]), from: "a", hosted: "claude-api"))
        let early = try activeChannel()
        policy.track(early, identityID: laptop.id)
        #expect(policy.updateGrant(grant([ipad.id]), from: "b", hosted: "claude-api"))
        early.embeddedEventLoop.run()
        #expect(!early.isActive, "the circuit B's narrowing took away was kept by A's stale grant")
        #expect(policy.decide(laptop, service: "claude-api", hosted: "claude-api") != .allow)
        #expect(policy.decide(ipad, service: "claude-api", hosted: "claude-api") == .allow)
        // A circuit decided before the narrowing and tracked after it is closed at once.
        let late = try activeChannel()
        policy.track(late, identityID: laptop.id)
        late.embeddedEventLoop.run()
        #expect(!late.isActive)

        // B's last link closes: its grant goes, and A's decides alone (a gone replica holds no widening back).
        policy.forgetGrant(from: "b")
        #expect(policy.decide(laptop, service: "claude-api", hosted: "claude-api") == .allow)
        let viaA = try activeChannel()
        policy.track(viaA, identityID: ipad.id)
        #expect(policy.liveCircuits == 1)
        // B links again with a grant that lacks the ipad: the ipad's circuit ends although B had no grant before to
        // drop it from.
        #expect(policy.updateGrant(grant([laptop.id]), from: "b", hosted: "claude-api"))
        viaA.embeddedEventLoop.run()
        #expect(!viaA.isActive)
        #expect(policy.decide(ipad, service: "claude-api", hosted: "claude-api") != .allow)
        #expect(policy.decide(laptop, service: "claude-api", hosted: "claude-api") == .allow)
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
        #expect(policy.decide(ipad, service: "claude-api", hosted: "claude-api") == .allow)
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
