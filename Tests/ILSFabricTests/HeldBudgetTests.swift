import ILSCrypto
import ILSTesting
import NIOCore
import NIOEmbedded
import Testing

@testable import ILSFabric

/// What held circuits keep is bounded hard (`RetentionBudget.limit`, counting what each carried in from its attached
/// state), and one identity holds at most `heldPerIdentity` circuits at once (issue 49: 400 circuits of one device kept
/// 12 times a 32 MiB total, because the total only stopped held circuits from reading more).
@Suite("Held circuits: a hard total, and a cap per identity")
struct HeldBudgetTests {
    @Test("the budget holds a circuit only if what it keeps fits, and at most heldPerIdentity of one identity")
    func budgetAdmission() {
        let budget = RetentionBudget(limit: 1_000, heldPerIdentity: 2)
        budget.add(600, identity: "a")
        #expect(budget.hold(600, identity: "a") == nil)
        // 600 held; 500 more do not fit, whoever they are.
        budget.add(500, identity: "b")
        #expect(budget.hold(500, identity: "b") == .total)
        #expect(budget.heldBytes == 600 && budget.heldCircuits == 1)
        #expect(budget.hold(0, identity: "a") == nil)
        #expect(budget.hold(0, identity: "a") == .identity, "a third circuit of one identity")
        #expect(budget.hold(0, identity: "b") == nil, "another identity is not affected")
        #expect(budget.refused(.total) == 1 && budget.refused(.identity) == 1)
        // A reservation is part of the held total, and never takes it past the limit.
        #expect(budget.reserve(400))
        #expect(!budget.reserve(1))
        #expect(budget.heldBytes == 1_000)
        budget.release(600, reserved: 400, identity: "a")
        #expect(budget.heldBytes == 0 && budget.heldCircuits == 2)
        #expect(budget.hold(0, identity: "a") == nil, "a released hold makes room in its identity's cap")
    }

    /// A resumable circuit whose far end is `peer`, that has written `records` full records its peer never
    /// acknowledged.
    static func circuit(_ retention: CircuitRetention, peer: String, records: Int) throws -> CircuitResetTests.Link {
        let link = try IdentityRetentionTests.circuit(retention, peer: peer)
        for _ in 0..<records {
            link.circuit.writeAndFlush(ByteBuffer(repeating: 7, count: IdentityRetentionTests.record), promise: nil)
            try exchangeBytes(link.device, link.controller)
        }
        return link
    }

    /// Ends the test's circuit and its connections: a held circuit's grace timer holds it (and what it keeps) until
    /// it closes, which LeakSanitizer reports as a leak.
    static func end(_ link: CircuitResetTests.Link) {
        link.circuit.close(promise: nil)
        link.loop.run()
        link.finish()
        link.loop.run()
    }

    /// The circuit's connection goes away: its path is lost.
    static func losePath(_ link: CircuitResetTests.Link) {
        _ = try? link.device.finish(acceptAlreadyClosed: true)
        link.loop.run()
    }

    @Test("a circuit whose kept bytes do not fit under the total beside the held ones is not held: it ends")
    func overTheTotalIsNotHeld() throws {
        // 20 records of 16 KiB keep 1.3 MiB as counted (each buffer rounded up to 32 KiB, plus its overhead).
        let budget = RetentionBudget(limit: 2 * 1024 * 1024)
        let retention = CircuitRetention(grace: .seconds(60), budget: budget)
        let first = try Self.circuit(retention, peer: "a", records: 20)
        defer { Self.end(first) }
        let kept = budget.bytes
        Self.losePath(first)
        #expect(first.circuit.isHeld)
        #expect(budget.heldBytes >= kept)
        let second = try Self.circuit(retention, peer: "b", records: 20)
        defer { Self.end(second) }
        Self.losePath(second)
        #expect(!second.circuit.isActive, "held past the total")
        #expect(budget.refused(.total) == 1)
        #expect(budget.heldBytes <= budget.limit)
        #expect(budget.bytes(of: "b") == 0, "the refused circuit keeps nothing")
    }

    @Test("one identity's circuits past heldPerIdentity are not held; another identity's are")
    func identityCap() throws {
        let budget = RetentionBudget(limit: 64 * 1024 * 1024, heldPerIdentity: 2)
        let retention = CircuitRetention(grace: .seconds(60), budget: budget)
        let links =
            try (0..<3).map { _ in try Self.circuit(retention, peer: "a", records: 1) }
            + [try Self.circuit(retention, peer: "b", records: 1)]
        defer { for link in links { Self.end(link) } }
        for link in links { Self.losePath(link) }
        #expect(links.map(\.circuit.isHeld) == [true, true, false, true])
        #expect(!links[2].circuit.isActive)
        #expect(budget.heldCircuits == 3 && budget.refused(.identity) == 1)
    }

    @Test("a held circuit reads on only while a whole read's reservation fits under the total")
    func heldWritabilityNeedsAReservation() throws {
        let record = IdentityRetentionTests.record
        // Room for the circuit's 10 records and one reservation, not two.
        let probe = try Self.circuit(CircuitRetention(grace: .seconds(60)), peer: "p", records: 10)
        let kept = probe.circuit.keptBytes
        Self.end(probe)
        let budget = RetentionBudget(limit: kept + RetentionBudget.writeReserve + record)
        let link = try Self.circuit(CircuitRetention(grace: .seconds(60), budget: budget), peer: "a", records: 10)
        defer { Self.end(link) }
        Self.losePath(link)
        #expect(link.circuit.isHeld)
        #expect(link.circuit.isWritable, "held, with room for a read")
        #expect(budget.heldBytes == kept + RetentionBudget.writeReserve)
        // One read's records: covered by the reservation; the next reservation does not fit.
        link.circuit.writeAndFlush(ByteBuffer(repeating: 7, count: record), promise: nil)
        link.loop.run()
        #expect(!link.circuit.isWritable)
        #expect(budget.heldBytes <= budget.limit)
        link.circuit.close(promise: nil)
        link.loop.run()
        #expect(budget.heldBytes == 0 && budget.bytes == 0 && budget.heldCircuits == 0)
    }
}
