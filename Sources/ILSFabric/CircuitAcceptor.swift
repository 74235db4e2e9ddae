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
/// reach a gateway), answers, and hands the stream over. Data that arrives before the answer is refused: a dialer
/// waits for `200`.
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

    /// `answerHeaders` are added to every answer, acceptance or refusal (the controller names the cluster's
    /// controllers there, `ControllerAddress.listHeader`).
    public init(answerHeaders: @escaping @Sendable () -> [(String, String)] = { [] }, decide: @escaping Decide) {
        self.decide = decide
        self.answerHeaders = answerHeaders
    }

    public func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        // An answer found while this read is delivered is written on the next tick (`answer`).
        reading = true
        defer { reading = false }
        guard !sawHead, case .headers(let request) = unwrapInboundIn(data) else {
            answer(context) {
                self.refuse($0, status: 400, code: "protocol_error", reason: "expected a CONNECT head first")
            }
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
                    do {
                        var headers = HPACKHeaders([(":status", "200")])
                        headers.add(contentsOf: self.answerHeaders())
                        context.writeAndFlush(self.wrapOutboundOut(.headers(.init(headers: headers))), promise: nil)
                        try install(context.pipeline.syncOperations)
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
    private func answer(_ context: ChannelHandlerContext, _ body: @escaping (ChannelHandlerContext) -> Void) {
        guard reading else {
            body(context)
            return
        }
        let channel = context.channel
        context.eventLoop.assumeIsolated().execute {
            guard channel.isActive else { return }
            body(context)
        }
    }

    private func refuse(_ context: ChannelHandlerContext, status: Int, code: String, reason: String) {
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
