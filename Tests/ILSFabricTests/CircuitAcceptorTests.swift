import ILSFabric
import NIOConcurrencyHelpers
import NIOCore
import NIOEmbedded
import NIOHPACK
import NIOHTTP2
import Testing

/// The accepting end of a circuit stream, on an embedded stream: what it does with DATA that comes before its answer
/// (refused on `ils-dial/1`; up to `earlyDataLimit` kept for the circuit on `ils-dial/2`, never for a refused one).
@Suite("Circuit acceptor: data before the answer")
struct CircuitAcceptorTests {
    /// Collects what reaches the handlers the acceptance installs.
    final class Carried: ChannelInboundHandler, Sendable {
        typealias InboundIn = HTTP2Frame.FramePayload
        let received = NIOLockedValueBox<[String]>([])

        func channelRead(context: ChannelHandlerContext, data: NIOAny) {
            if case .data(let frame) = unwrapInboundIn(data), case .byteBuffer(let bytes) = frame.data {
                received.withLockedValue { $0.append(String(buffer: bytes)) }
            }
        }
    }

    struct Stream {
        let channel: EmbeddedChannel
        let decision: EventLoopPromise<CircuitDecision>
        let carried = Carried()
    }

    /// A stream whose acceptor takes `earlyData` bytes before its answer; its decision waits on `decision`.
    func stream(earlyData: Int) throws -> Stream {
        let channel = EmbeddedChannel()
        // Active, as a stream is once open (an answer found during a read goes only to a stream still open).
        try channel.connect(to: SocketAddress(ipAddress: "127.0.0.1", port: 1)).wait()
        let decision = channel.eventLoop.makePromise(of: CircuitDecision.self)
        try channel.pipeline.syncOperations.addHandler(
            CircuitAcceptor(earlyData: earlyData) { _, _, _ in decision.futureResult }
        )
        try channel.writeInbound(
            HTTP2Frame.FramePayload.headers(.init(headers: [":method": "CONNECT", ":authority": "claude-api"]))
        )
        return Stream(channel: channel, decision: decision)
    }

    func data(_ text: String, end: Bool = false) -> HTTP2Frame.FramePayload {
        .data(.init(data: .byteBuffer(ByteBuffer(string: text)), endStream: end))
    }

    /// The status of the answer the acceptor wrote, and whether it ended the stream.
    func answer(_ stream: Stream) throws -> (status: String?, end: Bool)? {
        guard case .headers(let headers) = try stream.channel.readOutbound(as: HTTP2Frame.FramePayload.self) else {
            return nil
        }
        return (headers.headers.first(name: ":status"), headers.endStream)
    }

    func accept(_ stream: Stream) {
        let carried = stream.carried
        stream.decision.succeed(.accept(install: { try $0.addHandler(carried) }))
        stream.channel.embeddedEventLoop.run()
    }

    /// Ends a stream's test: its decision answered when the test gave none (`undecided`; an unanswered promise keeps
    /// the acceptor and its context), its channel closed (an embedded channel left open is held by its own pipeline,
    /// a cycle LeakSanitizer reports).
    func finish(_ stream: Stream, undecided: Bool = false) throws {
        if undecided {
            stream.decision.succeed(.refuse(status: 503, code: "test_over", reason: "the test is over"))
            stream.channel.embeddedEventLoop.run()
        }
        _ = try stream.channel.finish(acceptAlreadyClosed: true)
    }

    @Test("ils-dial/1: DATA before the answer is refused, as a dialer waits for 200")
    func refusedWithoutEarlyData() throws {
        let stream = try stream(earlyData: 0)
        try stream.channel.writeInbound(data("hello"))
        stream.channel.embeddedEventLoop.run()
        #expect(try answer(stream)?.status == "400")
        accept(stream)
        #expect(stream.carried.received.withLockedValue { $0 }.isEmpty)
        try finish(stream)
    }

    @Test("ils-dial/2: DATA before the answer waits and reaches the circuit first, after the 200")
    func earlyDataReachesTheCircuit() throws {
        let stream = try stream(earlyData: CircuitAcceptor.earlyDataLimit)
        // The dialer's own flow control is no request: it is not answered.
        try stream.channel.writeInbound(HTTP2Frame.FramePayload.windowUpdate(windowSizeIncrement: 983_041))
        try stream.channel.writeInbound(data("client"))
        try stream.channel.writeInbound(data("hello"))
        #expect(try stream.channel.readOutbound(as: HTTP2Frame.FramePayload.self) == nil)
        accept(stream)
        #expect(try answer(stream)?.status == "200")
        // In order, as one DATA frame of its own (copied out of the frames it came in).
        #expect(stream.carried.received.withLockedValue { $0 } == ["clienthello"])
        // After the answer, DATA goes straight through.
        try stream.channel.writeInbound(data("finished"))
        #expect(stream.carried.received.withLockedValue { $0 } == ["clienthello", "finished"])
        _ = try stream.channel.finish(acceptAlreadyClosed: true)
    }

    @Test("ils-dial/2: more early DATA than the bound, or an early end, is refused and carried nowhere")
    func earlyDataBeyondTheBound() throws {
        // Each frame costs its bytes and `earlyFrameCost`: room for "1234" and 8 more bytes, not for "56789".
        let over = try stream(earlyData: 2 * CircuitAcceptor.earlyFrameCost + 8)
        try over.channel.writeInbound(data("1234"))
        try over.channel.writeInbound(data("56789"))
        over.channel.embeddedEventLoop.run()
        #expect(try answer(over)?.status == "400")
        accept(over)
        #expect(over.carried.received.withLockedValue { $0 }.isEmpty)

        let ended = try stream(earlyData: CircuitAcceptor.earlyDataLimit)
        try ended.channel.writeInbound(data("hello", end: true))
        ended.channel.embeddedEventLoop.run()
        #expect(try answer(ended)?.status == "400")

        // A flood of tiny frames meets the bound too (each costs `earlyFrameCost`), and gets one answer.
        let flood = try stream(earlyData: CircuitAcceptor.earlyDataLimit)
        for _ in 0..<300 { try flood.channel.writeInbound(data("x")) }
        flood.channel.embeddedEventLoop.run()
        #expect(try answer(flood)?.status == "400")
        #expect(try flood.channel.readOutbound(as: HTTP2Frame.FramePayload.self) == nil)
        accept(flood)
        #expect(flood.carried.received.withLockedValue { $0 }.isEmpty)
        for stream in [over, flood] { try finish(stream) }
        try finish(ended, undecided: true)
    }

    /// The refusal of DATA beyond the bound is written a tick after the read that brought it; an acceptance that
    /// lands within that tick must not win over it.
    @Test("ils-dial/2: DATA beyond the bound refuses the circuit even when its acceptance lands in the same tick")
    func refusalBeyondTheBoundBeatsAnAcceptance() throws {
        let over = try stream(earlyData: 2 * CircuitAcceptor.earlyFrameCost + 8)
        try over.channel.writeInbound(data("1234"))
        try over.channel.writeInbound(data("56789"))
        accept(over)
        #expect(try answer(over)?.status == "400")
        #expect(over.carried.received.withLockedValue { $0 }.isEmpty)
        try finish(over)
    }

    @Test("ils-dial/2: a refused circuit's early DATA goes nowhere")
    func refusedDropsEarlyData() throws {
        let stream = try stream(earlyData: CircuitAcceptor.earlyDataLimit)
        try stream.channel.writeInbound(data("hello"))
        stream.decision.succeed(.refuse(status: 403, code: "dial_denied", reason: "no"))
        stream.channel.embeddedEventLoop.run()
        let refusal = try answer(stream)
        #expect(refusal?.status == "403")
        #expect(refusal?.end == true)
        #expect(stream.carried.received.withLockedValue { $0 }.isEmpty)
        _ = try stream.channel.finish(acceptAlreadyClosed: true)
    }
}
