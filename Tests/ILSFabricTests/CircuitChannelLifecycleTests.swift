import ILSTesting
import NIOConcurrencyHelpers
import NIOCore
import NIOEmbedded
import NIOHTTP2
import Testing

@testable import ILSFabric

/// `CircuitChannel` as a channel, on an embedded loop whose clock the circuit takes (`EventLoop.now`): held, its grace
/// window running out, resumed on a new path, its watermarks, its options, and its release. The machine's decisions
/// alone are `CircuitPathMachineTests`; these check that the channel carries them out (issue 49, item 5).
@Suite("A circuit channel's lifecycle")
struct CircuitChannelLifecycleTests {
    /// What the circuit's pipeline saw, in order, and whether the circuit counted as held when it saw it.
    final class Recorder: ChannelInboundHandler, Sendable {
        typealias InboundIn = ByteBuffer
        let seen = NIOLockedValueBox<[String]>([])

        var events: [String] { seen.withLockedValue { $0 } }

        private func note(_ event: String) { seen.withLockedValue { $0.append(event) } }

        func channelRead(context: ChannelHandlerContext, data: NIOAny) {
            note("read \(String(buffer: unwrapInboundIn(data)))")
        }

        func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
            if case ChannelEvent.inputClosed = event { note("input closed") }
        }

        func errorCaught(context: ChannelHandlerContext, error: any Error) {
            let held = (context.channel as? CircuitChannel)?.heldFlag ?? false
            note("error \((error as? E2ECircuitError)?.code ?? "\(error)")\(held ? " while held" : "")")
        }

        func channelWritabilityChanged(context: ChannelHandlerContext) {
            note("writable \(context.channel.isWritable)")
        }

        func channelInactive(context: ChannelHandlerContext) { note("inactive") }
    }

    static func recorded(_ link: CircuitResetTests.Link) throws -> Recorder {
        let recorder = Recorder()
        try link.circuit.pipeline.syncOperations.addHandler(recorder)
        return recorder
    }

    static func write(_ link: CircuitResetTests.Link, _ text: String) throws {
        link.circuit.writeAndFlush(ByteBuffer(string: text), promise: nil)
        try exchangeBytes(link.device, link.controller)
    }

    /// The peer's end of the current stream sends `text`, with END_STREAM if `end`.
    static func peerSends(_ link: CircuitResetTests.Link, _ peer: any Channel, _ text: String, end: Bool = false) throws
    {
        peer.writeAndFlush(
            HTTP2Frame.FramePayload.data(.init(data: .byteBuffer(ByteBuffer(string: text)), endStream: end)),
            promise: nil
        )
        try exchangeBytes(link.device, link.controller)
    }

    /// The circuit's stream is reset under it; its connection stays. (Not `HeldBudgetTests.losePath`: an embedded
    /// channel's `finish` cancels every task scheduled on the loop, the grace timer among them.)
    static func resetPath(_ link: CircuitResetTests.Link) throws {
        let stream = try #require(link.circuit.pathStream)
        stream.close(promise: nil)
        try exchangeBytes(link.device, link.controller)
    }

    @Test("a held circuit ends when its grace window runs out on the loop's clock, not before, and is no longer held")
    func graceRunsOutOnTheLoopsClock() throws {
        let retention = CircuitRetention(grace: .seconds(60), budget: RetentionBudget(limit: 64 * 1024 * 1024))
        let link = try IdentityRetentionTests.circuit(retention, peer: "device-1")
        defer { HeldBudgetTests.end(link) }
        let recorder = try Self.recorded(link)
        var heldInCallback: Bool?
        link.circuit.onGraceExpired.append { heldInCallback = $0.heldFlag }
        try Self.write(link, "kept")
        try Self.resetPath(link)
        #expect(link.circuit.isHeld && link.circuit.heldFlag)
        #expect(retention.budget.heldCircuits == 1)

        link.loop.advanceTime(by: .seconds(59))
        #expect(link.circuit.isActive && link.circuit.heldFlag, "ended before its window")
        link.loop.advanceTime(by: .seconds(2))
        #expect(!link.circuit.isActive && !link.circuit.heldFlag)
        #expect(heldInCallback == false, "the flag others read said held after the machine let the circuit go")
        #expect(recorder.events.suffix(2) == ["error not_resumed", "inactive"])
        #expect(retention.budget.heldCircuits == 0 && retention.budget.heldBytes == 0 && retention.budget.bytes == 0)
    }

    @Test("a resumed circuit sends the answer, then every record the peer lacks, on its new path; a replay is refused")
    func resumedOnANewPath() throws {
        let retention = CircuitRetention(grace: .seconds(60), budget: RetentionBudget(limit: 64 * 1024 * 1024))
        let link = try IdentityRetentionTests.circuit(retention, peer: "device-1")
        defer { HeldBudgetTests.end(link) }
        let recorder = try Self.recorded(link)
        try Self.write(link, "one")
        try Self.write(link, "two")
        IdentityRetentionTests.acknowledge(link, 1)
        try Self.resetPath(link)
        #expect(link.circuit.isHeld && link.circuit.heldFlag)

        let path = try link.newPath()
        let refusal = link.circuit.resume(
            on: path,
            attempt: 1,
            peerReceived: 1,
            answer: ByteBuffer(string: "answer")
        )
        #expect(refusal == nil)
        try exchangeBytes(link.device, link.controller)
        #expect(link.seen.events.withLockedValue { $0 }.suffix(2) == ["answer", "two"])
        #expect(!link.circuit.heldFlag && link.circuit.state == .attached && link.circuit.isWritable)
        #expect(retention.budget.heldCircuits == 0 && retention.budget.heldBytes == 0)
        #expect(!recorder.events.contains { $0.hasPrefix("error") || $0 == "inactive" })

        let again = try link.newPath()
        let replay = link.circuit.resume(on: again, attempt: 1, peerReceived: 1, answer: ByteBuffer(string: "x"))
        #expect(replay == "the resumption was replayed")
        #expect(link.circuit.pathStream === path.channel, "a refused resumption took the path")
    }

    @Test("a held circuit of small records keeps them in one buffer, counted at their bytes, and sends them whole")
    func heldSmallRecordsAreCompacted() throws {
        let retention = CircuitRetention(grace: .seconds(60), budget: RetentionBudget(limit: 64 * 1024 * 1024))
        let link = try IdentityRetentionTests.circuit(retention, peer: "device-1")
        defer { HeldBudgetTests.end(link) }
        let events = (0..<50).map { "event \($0)" }
        for event in events {
            // Each in a buffer of its own with room to spare, as a sealed SSE event is.
            var record = link.circuit.allocator.buffer(capacity: 1024)
            record.writeString(event)
            link.circuit.writeAndFlush(record, promise: nil)
        }
        try exchangeBytes(link.device, link.controller)
        let attached = link.circuit.keptBytes
        try Self.resetPath(link)
        #expect(link.circuit.isHeld)
        let bytes = events.reduce(0) { $0 + $1.utf8.count }
        #expect(link.circuit.keptBytes == bytes + events.count * CircuitChannel.recordOverhead)
        #expect(link.circuit.keptBytes < attached / 4)
        #expect(retention.budget.heldBytes == link.circuit.keptBytes + RetentionBudget.writeReserve)
        #expect(retention.budget.bytes(of: "device-1") == link.circuit.keptBytes)
        // One buffer: each record starts where the one before it ends (a buffer copied at each slice would not).
        let starts = link.circuit.keptRecords.map { record in
            record.withUnsafeReadableBytes { Int(bitPattern: $0.baseAddress) }
        }
        let ends = zip(starts, link.circuit.keptRecords).map { $0 + $1.readableBytes }
        #expect(Array(starts.dropFirst()) == Array(ends.dropLast()), "the kept records are not one buffer")

        let path = try link.newPath()
        #expect(link.circuit.resume(on: path, attempt: 1, peerReceived: 0, answer: ByteBuffer(string: "answer")) == nil)
        try exchangeBytes(link.device, link.controller)
        #expect(Array(link.seen.events.withLockedValue { $0 }.suffix(events.count + 1)) == ["answer"] + events)
        IdentityRetentionTests.acknowledge(link, events.count)
        #expect(link.circuit.keptBytes == 0 && retention.budget.bytes == 0)
    }

    @Test("a circuit stopped at its bound (high watermark) is writable again only at its low watermark")
    func watermarks() throws {
        let retention = CircuitRetention(grace: .seconds(60), perCircuit: CircuitRetention.minimumPerCircuit)
        let link = try IdentityRetentionTests.circuit(retention, peer: "device-1")
        defer { HeldBudgetTests.end(link) }
        let recorder = try Self.recorded(link)
        let written = try IdentityRetentionTests.fill(link)
        #expect(!link.circuit.isWritable && link.circuit.keptBytes >= retention.perCircuit)
        var acknowledged = 0
        while acknowledged < written {
            acknowledged += 1
            IdentityRetentionTests.acknowledge(link, acknowledged)
            guard link.circuit.keptBytes > retention.lowWatermark else { break }
            #expect(!link.circuit.isWritable, "writable again above the low watermark, at \(link.circuit.keptBytes)")
        }
        #expect(link.circuit.keptBytes <= retention.lowWatermark && link.circuit.isWritable)
        #expect(acknowledged > 1, "one ACK took it below the low watermark: the test shows nothing")
        #expect(recorder.events == ["writable false", "writable true"])
    }

    @Test("the far end's END_STREAM goes up as inputClosed by default, and closes the circuit without half-closure")
    func remoteHalfClosure() throws {
        for allowed in [true, false] {
            let link = try CircuitResetTests.Link()
            defer { HeldBudgetTests.end(link) }
            let recorder = try Self.recorded(link)
            try link.circuit.syncOptions!.setOption(.allowRemoteHalfClosure, value: allowed)
            #expect(try link.circuit.syncOptions!.getOption(.allowRemoteHalfClosure) == allowed)
            let peer = try CircuitResetTests.answering(link)
            try Self.peerSends(link, peer, "last", end: true)
            link.loop.run()
            if allowed {
                #expect(recorder.events == ["read last", "input closed"])
                #expect(link.circuit.isActive)
            } else {
                #expect(recorder.events == ["read last", "inactive"])
                #expect(!link.circuit.isActive)
            }
        }
    }

    @Test("closing a circuit's input is refused, and the circuit goes on")
    func inputCloseIsRefused() throws {
        let link = try CircuitResetTests.Link()
        defer { HeldBudgetTests.end(link) }
        var failure: (any Error)?
        link.circuit.close(mode: .input).whenFailure { failure = $0 }
        link.loop.run()
        #expect(failure as? ChannelError == .operationUnsupported)
        #expect(link.circuit.isActive)
    }

    @Test("with autoRead off, a circuit of a suite that is not resumable reads from its path only when asked")
    func autoReadOff() throws {
        let link = try CircuitResetTests.Link()
        defer { HeldBudgetTests.end(link) }
        let recorder = try Self.recorded(link)
        let peer = try CircuitResetTests.answering(link)
        try link.circuit.syncOptions!.setOption(.autoRead, value: false)
        // The read asked for after the last read is still out: it takes the first frame.
        try Self.peerSends(link, peer, "a")
        try Self.peerSends(link, peer, "b")
        #expect(recorder.events == ["read a"])
        link.circuit.read()
        link.loop.run()
        #expect(recorder.events == ["read a", "read b"])
    }

    @Test("a closed circuit is freed: neither its path nor its pipeline keeps it")
    func closedCircuitIsFreed() throws {
        let link = try CircuitResetTests.Link()
        defer { link.finish() }
        weak var freed: CircuitChannel?
        let path = try link.newPath()
        do {
            let circuit = CircuitChannel(eventLoop: link.loop, allocator: link.circuit.allocator, retention: .init())
            freed = circuit
            circuit.start(on: path)
            circuit.writeAndFlush(ByteBuffer(string: "one"), promise: nil)
            try exchangeBytes(link.device, link.controller)
            circuit.close(promise: nil)
            link.loop.run()
        }
        #expect(freed == nil, "a closed circuit outlived its close")
    }
}
