public import NIOCore
public import NIOHPACK
public import NIOHTTP2

/// What the accepting side decides about a circuit request.
public enum CircuitDecision: Sendable {
    /// Answer `200` and install the handlers that carry the circuit after the acceptor (which then leaves).
    case accept(install: @Sendable (ChannelPipeline.SynchronousOperations) throws -> Void)
    /// Answer with `status` and the stable `code` and `reason`, then end the stream.
    case refuse(status: Int, code: String, reason: String)
}

/// The accepting end of a circuit stream: reads the `CONNECT` head, asks `decide` (which may take time, e.g. to
/// reach a gateway), answers, and hands the stream over. Data that arrives before the answer is refused (a dialer
/// waits for `200`), except up to `earlyData` bytes of it where the connection allows them (`ils-dial/2`: the
/// device's ClientHello follows its `CONNECT` at once): those wait here and go to what carries the circuit once it
/// is accepted, or nowhere if it is refused.
public final class CircuitAcceptor: ChannelInboundHandler, RemovableChannelHandler {
    public typealias InboundIn = HTTP2Frame.FramePayload
    public typealias InboundOut = HTTP2Frame.FramePayload
    public typealias OutboundOut = HTTP2Frame.FramePayload

    public typealias Decide =
        @Sendable (_ service: String, _ headers: HPACKHeaders, _ stream: any Channel)
        -> EventLoopFuture<CircuitDecision>

    private let decide: Decide
    private let answerHeaders: @Sendable () -> [(String, String)]
    private var sawHead = false
    /// Whether `channelRead` is running (see `answer`).
    private var reading = false
    /// The most DATA taken before the answer, and what came, copied into one buffer of its own (a payload is a slice
    /// of the HTTP/2 decoder's read buffer: held for the decision's round trip, it would keep that whole buffer and
    /// make the decoder copy its next one, as `StreamDataCodec.detached` explains). Each frame also counts
    /// `earlyFrameCost` against the bound, so a flood of tiny frames meets it too.
    private let earlyData: Int
    private var early: ByteBuffer?
    private var earlyBytes = 0
    public static let earlyFrameCost = 64
    /// A decision is taken (an answer written or on its way): nothing more is taken early.
    private var decided = false
    /// An answer was written: a stream gets one.
    private var answered = false

    /// What a device's circuit may send before its answer on `ils-dial/2`: a ClientHello (about 0.6 KiB and the
    /// device's certificate) with room to spare. Per circuit, so per identity at most its circuit cap times this.
    public static let earlyDataLimit = 16 * 1024

    static let tooEarly = "a circuit sent more before its answer than it may"

    /// `answerHeaders` are added to every answer, acceptance or refusal (the controller names the cluster's
    /// controllers there, `ControllerAddress.listHeader`).
    public init(
        earlyData: Int = 0,
        answerHeaders: @escaping @Sendable () -> [(String, String)] = { [] },
        decide: @escaping Decide
    ) {
        self.decide = decide
        self.answerHeaders = answerHeaders
        self.earlyData = earlyData
    }

    public func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        // An answer found while this read is delivered is written on the next tick (`answer`).
        reading = true
        defer { reading = false }
        let payload = unwrapInboundIn(data)
        switch payload {
        case .windowUpdate, .priority:
            // Flow control and priority of the dialer's own stream (a dialer that sends its ClientHello early opens
            // its stream window then): nothing to answer.
            if sawHead { return }
        default:
            break
        }
        if earlyData > 0, sawHead, !decided, case .data(let frame) = payload, !frame.endStream,
            case .byteBuffer(let bytes) = frame.data,
            earlyBytes + bytes.readableBytes + Self.earlyFrameCost <= earlyData
        {
            earlyBytes += bytes.readableBytes + Self.earlyFrameCost
            if early == nil { early = context.channel.allocator.buffer(capacity: bytes.readableBytes) }
            early!.writeImmutableBuffer(bytes)
            return
        }
        guard !sawHead, case .headers(let request) = payload else {
            decided = true
            let reason = sawHead ? Self.tooEarly : "expected a CONNECT head first"
            answer(context) { self.refuse($0, status: 400, code: "protocol_error", reason: reason) }
            return
        }
        sawHead = true
        guard request.headers.first(name: ":method") == "CONNECT",
            let service = request.headers.first(name: ":authority"), !service.isEmpty, service.utf8.count <= 128
        else {
            answer(context) {
                self.refuse($0, status: 400, code: "protocol_error", reason: "a circuit starts with CONNECT service")
            }
            return
        }
        let channel = context.channel
        decide(service, request.headers, channel).assumeIsolated().whenComplete { result in
            self.answer(context) { context in
                switch result {
                case .success(.accept(let install)):
                    // DATA beyond the early bound came while the decision was out: its refusal, due a tick after that
                    // read, stands, and what came early is carried nowhere.
                    guard !self.decided else {
                        self.refuse(context, status: 400, code: "protocol_error", reason: Self.tooEarly)
                        return
                    }
                    do {
                        self.decided = true
                        var headers = HPACKHeaders([(":status", "200")])
                        headers.add(contentsOf: self.answerHeaders())
                        context.writeAndFlush(self.wrapOutboundOut(.headers(.init(headers: headers))), promise: nil)
                        try install(context.pipeline.syncOperations)
                        // What came early goes first to what carries the circuit now, as one DATA frame.
                        if let early = self.early {
                            self.early = nil
                            context.fireChannelRead(self.wrapInboundOut(.data(.init(data: .byteBuffer(early)))))
                            context.fireChannelReadComplete()
                        }
                        context.pipeline.syncOperations.removeHandler(self, promise: nil)
                    } catch {
                        channel.close(promise: nil)
                    }
                case .success(.refuse(let status, let code, let reason)):
                    self.refuse(context, status: status, code: code, reason: reason)
                case .failure:
                    self.refuse(context, status: 502, code: "internal_error", reason: "the circuit could not be set up")
                }
            }
        }
    }

    /// Writes an answer, on the next tick if it was found during a read, and only to a stream still open.
    ///
    /// A peer that sends a stream's HEADERS and its RST_STREAM in one read makes swift-nio-http2 deliver the HEADERS
    /// while it closes the stream (`receiveStreamClosed` delivers the pending reads first). An answer written then
    /// reaches the connection's state machine after the stream is gone and is reported as a *connection* error
    /// (`NoSuchStream`), which ends the whole connection with every other circuit on it: review 3's reset flood
    /// closed each device connection after two streams, and a device that cancels a request the controller refuses at
    /// once would lose its connection the same way. A tick later the stream channel is closed and nothing is written.
    /// A stream gets one answer: a second one found meanwhile (a refusal for DATA beyond the early bound, after the
    /// decision's) is not written.
    private func answer(_ context: ChannelHandlerContext, _ body: @escaping (ChannelHandlerContext) -> Void) {
        let once = { (context: ChannelHandlerContext) in
            guard !self.answered else { return }
            self.answered = true
            body(context)
        }
        guard reading else {
            once(context)
            return
        }
        let channel = context.channel
        context.eventLoop.assumeIsolated().execute {
            guard channel.isActive else { return }
            once(context)
        }
    }

    private func refuse(_ context: ChannelHandlerContext, status: Int, code: String, reason: String) {
        decided = true
        early = nil
        var headers = HPACKHeaders([
            (":status", String(status)), (FabricProtocol.errorHeader, code),
            (FabricProtocol.reasonHeader, String(reason.prefix(300))),
        ])
        headers.add(contentsOf: answerHeaders())
        let channel = context.channel
        context.writeAndFlush(wrapOutboundOut(.headers(.init(headers: headers, endStream: true))))
            .whenComplete { _ in channel.close(promise: nil) }
    }
}
