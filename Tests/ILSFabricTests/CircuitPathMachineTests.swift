import NIOConcurrencyHelpers
import NIOCore
import NIOEmbedded
import Testing

@testable import ILSFabric

/// `CircuitPathMachine`'s transitions, without a channel. Each test names the transition it would catch the removal
/// of (`deploy/check-machine-mutations.py` removes them one by one).
@Suite("A circuit's paths: held on a lost path, resumed or ended")
struct CircuitPathMachineTests {
    static let now = NIODeadline.uptimeNanoseconds(1_000_000_000)

    static func attached(grace: TimeAmount = .seconds(60), resumable: Bool = true) -> CircuitPathMachine {
        var machine = CircuitPathMachine(grace: grace)
        _ = machine.established(resumable: resumable)
        return machine
    }

    @Test("a resumable circuit whose path is lost is held until the grace window's end")
    func lostPathIsHeld() {
        var machine = Self.attached()
        let result1 = machine.pathLost(now: Self.now)
        #expect(result1 == .hold(deadline: Self.now + .seconds(60)))
        #expect(machine.state == .held(deadline: Self.now + .seconds(60)))
        // A second loss report changes nothing.
        let result2 = machine.pathLost(now: Self.now)
        #expect(result2 == .none)
    }

    @Test(
        "a path lost during the handshake, without a resumable suite, with grace 0, or once the circuit settled, ends it"
    )
    func lostPathEnds() {
        var handshaking = CircuitPathMachine(grace: .seconds(60))
        let result3 = handshaking.pathLost(now: Self.now)
        #expect(result3 == .end)
        var old = Self.attached(resumable: false)
        let result4 = old.pathLost(now: Self.now)
        #expect(result4 == .end)
        var noGrace = Self.attached(grace: .zero)
        let result5 = noGrace.pathLost(now: Self.now)
        #expect(result5 == .end)
        var done = Self.attached()
        _ = done.outputDidEnd()
        _ = done.peerDidFinish()
        _ = done.outputWasAcknowledged()
        #expect(done.isSettled)
        let result6 = done.pathLost(now: Self.now)
        #expect(result6 == .end)
        #expect(done.state == .closed)
    }

    @Test("both FINALs crossed but ours not acknowledged: a path lost then is held, so our FINAL is sent again")
    func doneButUnacknowledgedIsHeld() {
        var machine = Self.attached()
        _ = machine.outputDidEnd()
        _ = machine.peerDidFinish()
        #expect(machine.isDone && !machine.isSettled)
        let held = machine.pathLost(now: Self.now)
        #expect(held == .hold(deadline: Self.now + .seconds(60)))
        var settled = Self.attached()
        _ = settled.outputDidEnd()
        _ = settled.peerDidFinish()
        _ = settled.outputWasAcknowledged()
        let ended = settled.pathLost(now: Self.now)
        #expect(ended == .end)
    }

    @Test("END_STREAM waits until both FINALs crossed and ours is acknowledged; once per path; a new path gets its own")
    func pathEndWaitsForSettlement() {
        var machine = Self.attached()
        let afterOwnFinal = machine.outputDidEnd()
        #expect(afterOwnFinal == .none, "END_STREAM right after our FINAL: the device could no longer acknowledge")
        let beforeAck = machine.peerDidFinish()
        #expect(beforeAck == .none)
        let due = machine.outputWasAcknowledged()
        #expect(due == .endPath)
        let twice = machine.outputWasAcknowledged()
        #expect(twice == .none)
        let after = machine.pathEndDue()
        #expect(!after)
        // Acknowledged before the peer finished: its FINAL is the event that settles it.
        var acknowledgedFirst = Self.attached()
        _ = acknowledgedFirst.outputDidEnd()
        let early = acknowledgedFirst.outputWasAcknowledged()
        #expect(early == .none)
        let settled = acknowledgedFirst.peerDidFinish()
        #expect(settled == .endPath)
        // Without resumption END_STREAM follows FINAL at once, as before.
        var old = Self.attached(resumable: false)
        let oldBefore = old.pathEndDue()
        #expect(!oldBefore)
        let oldDue = old.outputDidEnd()
        #expect(oldDue == .endPath)
        // A resumed path has had no END_STREAM yet (device side and gateway side).
        var device = Self.attached()
        _ = device.outputDidEnd()
        _ = device.peerDidFinish()
        _ = device.pathLost(now: Self.now)
        let heldDue = device.outputWasAcknowledged()
        #expect(heldDue == .none, "no path while held")
        _ = device.resumed()
        let deviceDue = device.pathEndDue()
        #expect(deviceDue)
        var gateway = Self.attached()
        _ = gateway.outputDidEnd()
        _ = gateway.peerDidFinish()
        let first = gateway.outputWasAcknowledged()
        #expect(first == .endPath)
        _ = gateway.resumeAccepted(attempt: 1, now: Self.now)
        let gatewayDue = gateway.pathEndDue()
        #expect(gatewayDue)
    }

    @Test("a close after both FINALs ends the path cleanly (END_STREAM once); any other close resets it")
    func closingEndsOrResets() {
        var done = Self.attached()
        _ = done.outputDidEnd()
        _ = done.peerDidFinish()
        let clean = done.closing()
        #expect(clean == .end(sendEndStream: true))
        #expect(done.state == .closed)
        var ended = Self.attached()
        _ = ended.outputDidEnd()
        _ = ended.peerDidFinish()
        _ = ended.outputWasAcknowledged()
        _ = ended.pathEndDue()
        let already = ended.closing()
        #expect(already == .end(sendEndStream: false))
        var cut = Self.attached()
        _ = cut.outputDidEnd()
        let reset = cut.closing()
        #expect(reset == .reset)
        var old = Self.attached(resumable: false)
        _ = old.outputDidEnd()
        _ = old.peerDidFinish()
        let oldReset = old.closing()
        #expect(oldReset == .reset)
    }

    @Test("only one end's end is not done: a path lost then is held")
    func halfDoneIsHeld() {
        var machine = Self.attached()
        _ = machine.outputDidEnd()
        #expect(!machine.isDone)
        let result7 = machine.pathLost(now: Self.now)
        #expect(result7 == .hold(deadline: Self.now + .seconds(60)))
    }

    @Test("the gateway accepts a resumption with a newer attempt, held or still attached, and refuses a replay")
    func attemptsOnlyGoUp() {
        var machine = Self.attached()
        // Asking changes nothing; accepting uses the attempt up.
        #expect(machine.resumeVerdict(attempt: 1, now: Self.now) == .attach)
        let accepted101 = machine.resumeAccepted(attempt: 1, now: Self.now)
        #expect(accepted101)
        #expect(machine.resumeVerdict(attempt: 1, now: Self.now) == .refuse(reason: "the resumption was replayed"))
        let accepted102 = machine.resumeAccepted(attempt: 1, now: Self.now)
        #expect(!accepted102)
        _ = machine.pathLost(now: Self.now)
        #expect(machine.resumeVerdict(attempt: 3, now: Self.now) == .attach)
        let accepted103 = machine.resumeAccepted(attempt: 3, now: Self.now)
        #expect(accepted103)
        #expect(machine.state == .attached)
        #expect(machine.resumeVerdict(attempt: 2, now: Self.now) == .refuse(reason: "the resumption was replayed"))
    }

    @Test("no resumption after the window, of a closed or non-resumable circuit, or before the handshake")
    func resumptionRefused() {
        var held = Self.attached(grace: .seconds(1))
        _ = held.pathLost(now: Self.now)
        #expect(
            held.resumeVerdict(attempt: 1, now: Self.now + .seconds(2))
                == .refuse(reason: "the circuit's grace window ran out")
        )
        let old = Self.attached(resumable: false)
        let result12 = old.resumeVerdict(attempt: 1, now: Self.now)
        #expect(result12 == .refuse(reason: "the circuit is not resumable"))
        let handshaking = CircuitPathMachine(grace: .seconds(60))
        let result13 = handshaking.resumeVerdict(attempt: 1, now: Self.now)
        #expect(result13 == .refuse(reason: "the circuit is not held"))
        var closed = Self.attached()
        closed.closed()
        let result14 = closed.resumeVerdict(attempt: 1, now: Self.now)
        #expect(result14 == .refuse(reason: "the circuit is not held"))
    }

    @Test("the grace timer ends a circuit still held at its deadline, and nothing else")
    func graceExpiry() {
        var held = Self.attached(grace: .seconds(1))
        _ = held.pathLost(now: Self.now)
        let result15 = held.graceExpired(now: Self.now)
        #expect(!result15)
        let result16 = held.graceExpired(now: Self.now + .seconds(1))
        #expect(result16)
        #expect(held.state == .closed)
        var resumed = Self.attached(grace: .seconds(1))
        _ = resumed.pathLost(now: Self.now)
        let result17 = resumed.resumed()
        #expect(result17)
        let result18 = resumed.graceExpired(now: Self.now + .seconds(5))
        #expect(!result18)
        #expect(resumed.state == .attached)
    }

    @Test("the device numbers its attempts from 1 while held, and has none once the window is over")
    func deviceAttempts() {
        var machine = Self.attached(grace: .seconds(1))
        let result19 = machine.nextAttempt(now: Self.now)
        #expect(result19 == nil)
        _ = machine.pathLost(now: Self.now)
        let result20 = machine.nextAttempt(now: Self.now)
        #expect(result20 == 1)
        let result21 = machine.nextAttempt(now: Self.now)
        #expect(result21 == 2)
        let result22 = machine.nextAttempt(now: Self.now + .seconds(2))
        #expect(result22 == nil)
        let result23 = machine.resumed()
        #expect(result23)
        let result24 = machine.resumed()
        #expect(!result24)
    }
}

@Suite("ACKs of a resumable circuit")
struct InboundRecordsTests {
    @Test("at the peer's FINAL every record opened is acknowledged, the ones still waiting included, and counted once")
    func finalAcknowledgesAll() {
        var inbound = InboundRecords(gated: true)
        let loop = EmbeddedEventLoop()
        _ = inbound.opened(ByteBuffer(string: "a"), final: false)
        _ = inbound.opened(ByteBuffer(string: "b"), final: false)
        let none = inbound.acknowledgeAll(resumable: false)
        #expect(none == nil)
        let all = inbound.acknowledgeAll(resumable: true)
        #expect(all == 2)
        // Handed up later, they are not counted again; the peer's later ACKs still are.
        _ = inbound.readRequested()
        inbound.readCompleted()
        let nothingNew = inbound.ackDue(resumable: true, on: loop) {}
        #expect(nothingNew == nil)
        for _ in 0..<InboundRecords.acksPerAck { inbound.openedAck() }
        let acks = inbound.ackDue(resumable: true, on: loop) {}
        #expect(acks == 2 + UInt64(InboundRecords.acksPerAck))
        let once = inbound.acknowledgeAll(resumable: true)
        #expect(once == nil)
    }

    @Test(
        "a sender that keeps the least it may (640 KiB) has an ACK owed (10 ms) before its bound stops it, whatever its records' size from 256 bytes; at the default (3 MiB) and at an earlier release's (1 MiB, full records) one due at once; 512 KiB would not"
    )
    func leastRetentionIsAcknowledgedBeforeItFills() {
        let allocator = ByteBufferAllocator()
        enum Ack { case none, owed, atOnce }
        /// Records of `plaintext` bytes as a sender writes them until what it keeps reaches `bound`
        /// (`CircuitChannel.write0`: each at its framed buffer's capacity, as NIO rounds it, plus `recordOverhead`;
        /// then not writable), opened by the receiver one by one: whether an ACK fell due at once before the sender
        /// stopped, or was owed (it goes within 10 ms), or neither (the ACK of last resort waits 1 s).
        func acknowledgedBeforeStop(bound: Int, plaintext: Int) -> Ack {
            let framing = 64 * 1024 - RecordLimits.sealedPlaintext  // length prefix and seal: a full record is 64 KiB
            let cost = allocator.buffer(capacity: plaintext + framing).capacity + CircuitChannel.recordOverhead
            var inbound = InboundRecords()
            let loop = EmbeddedEventLoop()
            // Its timers (the 1 s and 10 ms ACKs armed on the way) run out at shutdown: left queued, they leak.
            defer { _ = try? loop.syncShutdownGracefully() }
            var kept = 0
            var owed = false
            while kept < bound {
                kept += cost
                _ = inbound.opened(ByteBuffer(repeating: 0, count: plaintext), final: false)
                if inbound.ackDue(resumable: true, on: loop, later: {}) != nil { return .atOnce }
                owed = owed || inbound.isOwed
            }
            return owed ? .owed : .none
        }
        #expect(CircuitRetention().perCircuit == CircuitRetention.defaultPerCircuit)
        #expect(CircuitRetention(perCircuit: 64 * 1024).perCircuit == CircuitRetention.minimumPerCircuit)
        // Full records, and records just past each power of two's worth of buffer (their buffer twice their size).
        let sizes = [
            RecordLimits.sealedPlaintext, 32_767, 32_748, 16_383, 16_364, 8_172, 4_076, 2_028, 1_004, 492, 256,
        ]
        for size in sizes {
            #expect(
                acknowledgedBeforeStop(bound: CircuitRetention.minimumPerCircuit, plaintext: size) != .none,
                "\(size) B"
            )
            #expect(
                acknowledgedBeforeStop(bound: CircuitRetention.defaultPerCircuit, plaintext: size) == .atOnce,
                "\(size) B"
            )
        }
        // A sender of an earlier release (1 MiB, full records) gets its ACK at once before it stops.
        #expect(acknowledgedBeforeStop(bound: 1024 * 1024, plaintext: RecordLimits.sealedPlaintext) == .atOnce)
        // Smaller bounds stop the sender first: 512 KiB for records whose buffer is twice them (a second's wait at
        // every fill), 256 KiB even for full records.
        #expect(acknowledgedBeforeStop(bound: 512 * 1024, plaintext: 32_767) == .none)
        #expect(acknowledgedBeforeStop(bound: 256 * 1024, plaintext: RecordLimits.sealedPlaintext) == .none)
    }

    @Test(
        "an end that receives only ACKs (a download's sender) acknowledges every 32 of them, so they never fill the peer's bound"
    )
    func acksAreAcknowledged() {
        var inbound = InboundRecords()
        let loop = EmbeddedEventLoop()
        for _ in 0..<(InboundRecords.acksPerAck - 1) { inbound.openedAck() }
        let early = inbound.ackDue(resumable: true, on: loop) {}
        #expect(early == nil)
        inbound.openedAck()
        let due = inbound.ackDue(resumable: true, on: loop) {}
        #expect(due == UInt64(InboundRecords.acksPerAck))
        // Nothing new since: no ACK, and none without a resumable suite.
        let again = inbound.ackDue(resumable: true, on: loop) {}
        #expect(again == nil)
        for _ in 0..<InboundRecords.acksPerAck { inbound.openedAck() }
        let old = inbound.ackDue(resumable: false, on: loop) {}
        #expect(old == nil)
    }

    @Test("16 data records make an ACK due; the peer's ACKs between them do not count toward the 16 (protocol.md)")
    func acksDoNotHastenTheNextAck() throws {
        var inbound = InboundRecords()
        let loop = EmbeddedEventLoop()
        defer { _ = try? loop.syncShutdownGracefully() }
        for _ in 0..<(InboundRecords.ackEveryRecords - 1) {
            _ = inbound.opened(ByteBuffer(string: "x"), final: false)
            inbound.openedAck()
        }
        let early = inbound.ackDue(resumable: true, on: loop) {}
        #expect(early == nil, "an ACK came due after \(InboundRecords.ackEveryRecords - 1) data records")
        _ = inbound.opened(ByteBuffer(string: "x"), final: false)
        // Due now, and waiting for data of this end's to go with (`takeOwed`); the count acknowledged is every record
        // numbered, the peer's ACKs included.
        let waits = inbound.ackDue(resumable: true, on: loop) {}
        #expect(waits == nil)
        #expect(inbound.takeOwed() == UInt64(2 * InboundRecords.ackEveryRecords - 1))
        #expect(inbound.takeOwed() == nil)
    }

    @Test("an ACK due by its 16 records goes with this end's next data, or alone 10 ms later; due by bytes, at once")
    func owedAckWaitsForData() throws {
        var inbound = InboundRecords()
        let loop = EmbeddedEventLoop()
        defer { _ = try? loop.syncShutdownGracefully() }
        let fired = NIOLockedValueBox(0)
        for _ in 0..<InboundRecords.ackEveryRecords { _ = inbound.opened(ByteBuffer(string: "x"), final: false) }
        #expect(inbound.ackDue(resumable: true, on: loop) { fired.withLockedValue { $0 += 1 } } == nil)
        loop.advanceTime(by: InboundRecords.owedAckDelay - .milliseconds(1))
        #expect(fired.withLockedValue { $0 } == 0)
        loop.advanceTime(by: .milliseconds(1))
        #expect(fired.withLockedValue { $0 } == 1, "no data came: the ACK goes alone after owedAckDelay")
        // The timer's own call takes it (what the handlers do); then nothing is owed.
        #expect(inbound.acknowledgeNow() == InboundRecords.ackEveryRecords)
        #expect(inbound.takeOwed() == nil)
        // 768 KiB make it due at once, whatever the count.
        _ = inbound.opened(ByteBuffer(repeating: 0, count: InboundRecords.ackEveryBytes), final: false)
        #expect(inbound.ackDue(resumable: true, on: loop) {} == InboundRecords.ackEveryRecords + 1)
    }

    @Test("256 KiB in fewer than 16 records make an ACK owed, as 16 records do: it goes alone 10 ms later, not 1 s")
    func bytesMakeAnAckOwed() throws {
        var inbound = InboundRecords()
        let loop = EmbeddedEventLoop()
        defer { _ = try? loop.syncShutdownGracefully() }
        let fired = NIOLockedValueBox(0)
        let record = InboundRecords.owedAfterBytes / 4
        for _ in 0..<3 { _ = inbound.opened(ByteBuffer(repeating: 0, count: record), final: false) }
        #expect(inbound.ackDue(resumable: true, on: loop) { fired.withLockedValue { $0 += 1 } } == nil)
        loop.advanceTime(by: InboundRecords.owedAckDelay)
        #expect(fired.withLockedValue { $0 } == 0, "owed before 256 KiB")
        #expect(inbound.takeOwed() == nil)
        _ = inbound.opened(ByteBuffer(repeating: 0, count: record), final: false)
        #expect(inbound.ackDue(resumable: true, on: loop) { fired.withLockedValue { $0 += 1 } } == nil)
        #expect(inbound.takeOwed() == 4, "256 KiB handed up make an ACK owed, to go with this end's next data")
        for _ in 0..<4 { _ = inbound.opened(ByteBuffer(repeating: 0, count: record), final: false) }
        #expect(inbound.ackDue(resumable: true, on: loop) { fired.withLockedValue { $0 += 1 } } == nil)
        loop.advanceTime(by: InboundRecords.owedAckDelay)
        #expect(fired.withLockedValue { $0 } == 1, "no data came: the owed ACK goes alone after owedAckDelay")
    }
}
