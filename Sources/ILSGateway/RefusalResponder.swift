import Foundation
import ILSProxy
import NIOCore
import NIOHTTP1

/// Answers the one request of a connection the gateway will not proxy with its JSON error (`{"code", "error"}`,
/// as the proxy's own errors) and `Connection: close`, then closes. Nothing reaches the backend. The request is
/// answered once its head has arrived, so the client has sent what it meant to and reads the answer instead of a
/// reset; a client that sends nothing is closed after `timeout`.
final class RefusalResponder: ChannelInboundHandler {
    typealias InboundIn = HTTPServerRequestPart
    typealias OutboundOut = HTTPServerResponsePart

    private struct Body: Encodable {
        let code: String
        let error: String
    }

    private let refusal: ProxyError
    private let timeout: TimeAmount
    private var answered = false
    private var deadline: Scheduled<Void>?

    init(refusal: ProxyError, timeout: TimeAmount) {
        self.refusal = refusal
        self.timeout = timeout
    }

    /// Sets up the HTTP/1.1 codec and the responder at the end of `pipeline`.
    static func configure(
        _ pipeline: ChannelPipeline.SynchronousOperations,
        refusal: ProxyError,
        timeout: TimeAmount
    ) throws {
        try pipeline.configureHTTPServerPipeline(withPipeliningAssistance: false, withErrorHandling: true)
        try pipeline.addHandler(RefusalResponder(refusal: refusal, timeout: timeout))
    }

    func handlerAdded(context: ChannelHandlerContext) {
        let channel = context.channel
        deadline = context.eventLoop.scheduleTask(in: timeout) { channel.close(promise: nil) }
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        deadline?.cancel()
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        guard case .head(let request) = unwrapInboundIn(data), !answered else { return }
        answered = true
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        var json = (try? encoder.encode(Body(code: refusal.code, error: refusal.reason))) ?? Data()
        json.append(UInt8(ascii: "\n"))
        var headers = HTTPHeaders()
        headers.add(name: "Content-Type", value: "application/json")
        headers.add(name: "Content-Length", value: "\(json.count)")
        headers.add(name: "Connection", value: "close")
        let head = HTTPResponseHead(version: request.version, status: refusal.status, headers: headers)
        context.write(wrapOutboundOut(.head(head)), promise: nil)
        context.write(wrapOutboundOut(.body(.byteBuffer(ByteBuffer(bytes: json)))), promise: nil)
        let channel = context.channel
        context.writeAndFlush(wrapOutboundOut(.end(nil))).whenComplete { _ in channel.close(promise: nil) }
    }
}
