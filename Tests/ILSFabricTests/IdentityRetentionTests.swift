import ILSCrypto
import ILSTesting
import NIOCore
import Testing

@testable import ILSFabric

/// What one identity's resumable circuits keep together (`RetentionBudget.perIdentity`): a device with many circuits
/// open to fast answers that it does not read must not make the gateway keep a full bound for each.
@Suite("What one identity's circuits keep")
struct IdentityRetentionTests {
    static let record = RecordLimits.sealedPlaintext

    /// A resumable circuit whose far end is `peer`, established on a stream of its own.
    static func circuit(_ retention: CircuitRetention, peer: String) throws -> CircuitResetTests.Link {
        let link = try CircuitResetTests.Link(retention: retention)
        let keys = E2EDirectionKeys(
            initiatorToResponder: Array(repeating: 1, count: 32),
            responderToInitiator: Array(repeating: 2, count: 32)
        )
        link.circuit.triggerUserOutboundEvent(
            CircuitRecordsEvent.established(secrets: E2EResumeSecrets(keys: keys), peerID: peer),
            promise: nil
        )
        link.loop.run()
        #expect(link.circuit.isWritable)
        return link
    }

    /// Writes full records, each carried to the controller's end (so the stream stays writable), until the circuit
    /// is not writable (at most `limit` of them); returns how many.
    static func fill(_ link: CircuitResetTests.Link, limit: Int = 200) throws -> Int {
        var written = 0
        while link.circuit.isWritable, written < limit {
            link.circuit.writeAndFlush(ByteBuffer(repeating: 7, count: record), promise: nil)
            try exchangeBytes(link.device, link.controller)
            written += 1
        }
        return written
    }

    static func acknowledge(_ link: CircuitResetTests.Link, _ count: Int) {
        link.circuit.triggerUserOutboundEvent(CircuitRecordsEvent.acknowledged(UInt64(count)), promise: nil)
        link.loop.run()
    }

    @Test(
        "past 640 KiB a circuit stops at its identity's bound; below it never; another identity's circuits are not touched; its own ACK lets it go on; nothing stays counted"
    )
    func identityBound() throws {
        let budget = RetentionBudget(limit: CircuitRetention.defaultTotal, perIdentity: 2 * 1024 * 1024)
        let retention = CircuitRetention(perCircuit: CircuitRetention.maximumPerCircuit, budget: budget)
        let a = try Self.circuit(retention, peer: "device-1")
        let b = try Self.circuit(retention, peer: "device-1")
        let c = try Self.circuit(retention, peer: "device-2")
        defer { for link in [a, b, c] { link.finish() } }

        // A alone reaches its identity's 2 MiB, well under its own 4 MiB.
        let writtenA = try Self.fill(a)
        let keptA = budget.bytes(of: "device-1")
        #expect(keptA >= budget.perIdentity && keptA < budget.perIdentity + 2 * 64 * 1024, "A keeps \(keptA)")
        #expect(writtenA < CircuitRetention.maximumPerCircuit / (64 * 1024))

        // B, of the same identity, still gets its 640 KiB (so its own ACK falls due), and no more.
        let writtenB = try Self.fill(b)
        let keptB = budget.bytes(of: "device-1") - keptA
        #expect(keptB >= CircuitRetention.minimumPerCircuit, "B keeps \(keptB)")
        #expect(keptB < CircuitRetention.minimumPerCircuit + 64 * 1024 + CircuitChannel.recordOverhead)
        #expect(writtenB == 10)

        // C, another identity's, goes to that identity's bound: device-1's keeping takes nothing from it.
        _ = try Self.fill(c)
        let keptC = budget.bytes(of: "device-2")
        #expect(keptC >= budget.perIdentity && keptC < budget.perIdentity + 64 * 1024 + 256, "C keeps \(keptC)")
        #expect(budget.bytes == keptA + keptB + keptC)

        // B's own ACK brings it back under 640 KiB: writable again, whatever A keeps.
        Self.acknowledge(b, 2)
        #expect(b.circuit.isWritable)
        // A's ACK of half: still over the identity's bound with B, so A stays stopped until B's share goes too.
        Self.acknowledge(a, 4)
        let afterHalf = budget.bytes(of: "device-1")
        #expect(!a.circuit.isWritable || afterHalf < budget.perIdentity)
        Self.acknowledge(a, writtenA)
        #expect(a.circuit.isWritable)

        // Closed, they count nothing, and the registry forgets both identities.
        for link in [a, b, c] {
            link.circuit.close(promise: nil)
            link.loop.run()
        }
        #expect(budget.bytes == 0)
        #expect(budget.bytes(of: "device-1") == 0 && budget.bytes(of: "device-2") == 0)
        #expect(budget.identities == 0)
    }

    @Test("the default bound is below the protocol's 4 MiB by a write, and eight defaults fit in an identity's share")
    func defaults() {
        #expect(CircuitRetention.defaultPerCircuit <= CircuitRetention.maximumPerCircuit - 2 * 64 * 1024)
        #expect(CircuitRetention.defaultPerIdentity >= 8 * CircuitRetention.defaultPerCircuit)
        #expect(RetentionBudget(limit: 1).perIdentity == CircuitRetention.defaultPerIdentity)
    }
}
