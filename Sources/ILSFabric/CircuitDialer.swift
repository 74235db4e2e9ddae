public import NIOCore
public import NIOHPACK
public import NIOHTTP2

/// A circuit the other side refused, with its stable code and a sentence for a person.
public struct CircuitRefused: Error, Sendable, Equatable {
    public let code: String
    public let reason: String

    public init(code: String, reason: String) {
        self.code = code
        self.reason = reason
    }
}

/// Opens a circuit on a fresh HTTP/2 stream: `CONNECT` with `:authority` = service (RFC 9113 §8.5), then waits for
/// the answer. On `200` it completes `opened` and leaves the pipeline; anything else fails `opened` with the
/// refusal's code and reason and closes the stream.
public final class CircuitDialer: ChannelInboundHandler, RemovableChannelHandler {
    public typealias InboundIn = HTTP2Frame.FramePayload
    public typealias InboundOut = HTTP2Frame.FramePayload
    public typealias OutboundOut = HTTP2Frame.FramePayload

    private let service: String
    private let extraHeaders: [(String, String)]
    private let opened: EventLoopPromise<Void>
    private let answered: (@Sendable (HPACKHeaders) -> Void)?
    private var waiting = true

    /// `answered` is given the answer's headers, acceptance or refusal, before `opened` completes.
    public init(
        service: String,
        extraHeaders: [(String, String)] = [],
        opened: EventLoopPromise<Void>,
        answered: (@Sendable (HPACKHeaders) -> Void)? = nil
    ) {
        self.service = service
        self.extraHeaders = extraHeaders
        self.opened = opened
        self.answered = answered
    }

    public func handlerAdded(context: ChannelHandlerContext) {
        var headers = HPACKHeaders([(":method", "CONNECT"), (":authority", service)])
        for (name, value) in extraHeaders { headers.add(name: name, value: value) }
        context.writeAndFlush(wrapOutboundOut(.headers(.init(headers: headers))), promise: nil)
    }

    public func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        guard waiting else {
            context.fireChannelRead(data)
            return
        }
        let payload = unwrapInboundIn(data)
        switch payload {
        case .windowUpdate, .priority:
            // The peer's flow control for what this end sent before the answer (`ils-dial/2`'s ClientHello).
            return
        case .headers:
            break
        default:
            finish(context, .failure(CircuitRefused(code: "protocol_error", reason: "data before the answer")))
            return
        }
        guard case .headers(let answer) = payload else { return }
        answered?(answer.headers)
        if answer.headers.first(name: ":status") == "200" {
            waiting = false
            opened.succeed()
            context.pipeline.syncOperations.removeHandler(self, promise: nil)
        } else {
            let code = answer.headers.first(name: FabricProtocol.errorHeader) ?? "refused"
            let reason = answer.headers.first(name: FabricProtocol.reasonHeader) ?? "the circuit was refused"
            finish(context, .failure(CircuitRefused(code: code, reason: reason)))
        }
    }

    public func channelInactive(context: ChannelHandlerContext) {
        if waiting {
            waiting = false
            opened.fail(CircuitRefused(code: "closed", reason: "the circuit closed before it was answered"))
        }
        context.fireChannelInactive()
    }

    public func errorCaught(context: ChannelHandlerContext, error: any Error) {
        finish(context, .failure(error))
    }

    private func finish(_ context: ChannelHandlerContext, _ result: Result<Void, any Error>) {
        guard waiting else { return }
        waiting = false
        opened.completeWith(result)
        context.close(promise: nil)
    }
}
