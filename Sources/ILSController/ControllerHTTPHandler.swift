import Foundation
import ILSCore
import Logging
import NIOCore
import NIOHTTP1
import NIOSSL

/// Collects one API request at a time (body bounded), asks the router, writes the JSON answer. Tells the
/// `APIRequestDeadlineHandler` below the codec where each request's head arrives and its answer goes out.
///
/// The router is synchronous and quick (a store transaction, a signature), so it runs inline; the store
/// serialises writers itself.
final class ControllerHTTPHandler: ChannelInboundHandler {
    typealias InboundIn = HTTPServerRequestPart
    typealias OutboundOut = HTTPServerResponsePart

    private let router: ControllerRouter
    private let logger: Logger
    private let maximumBodyBytes: Int
    private var head: HTTPRequestHead?
    private var body: [UInt8] = []
    private var tooLarge = false

    /// The DER of the caller's verified client certificate, if one was presented.
    typealias ClientCertificate = (ChannelHandlerContext) -> [UInt8]?

    private let clientCertificate: ClientCertificate

    init(
        router: ControllerRouter,
        logger: Logger,
        maximumBodyBytes: Int,
        clientCertificate: @escaping ClientCertificate
    ) {
        self.router = router
        self.logger = logger
        self.maximumBodyBytes = maximumBodyBytes
        self.clientCertificate = clientCertificate
    }

    /// The peer certificate of the connection's TLS handler, which verified any presented chain against the
    /// controller CA before the first request.
    static func verifiedTLSClientCertificate(_ context: ChannelHandlerContext) -> [UInt8]? {
        let certificate = try? context.pipeline.syncOperations.handler(type: NIOSSLServerHandler.self).peerCertificate
        return try? certificate?.toDERBytes()
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        switch unwrapInboundIn(data) {
        case .head(let head):
            self.head = head
            body = []
            tooLarge = false
            context.triggerUserOutboundEvent(APIRequestDeadlineHandler.Event.headReceived, promise: nil)
        case .body(var buffer):
            if body.count + buffer.readableBytes > maximumBodyBytes {
                tooLarge = true
            } else if let bytes = buffer.readBytes(length: buffer.readableBytes) {
                body += bytes
            }
        case .end:
            guard let head else { return }
            self.head = nil
            let response: APIResponse
            if tooLarge {
                response = ControllerRouter.failure(ILSError(.invalidArgument, "the request body is too large"))
            } else {
                response = router.handle(request(head, context: context))
            }
            write(response, keepAlive: head.isKeepAlive && !tooLarge, context: context)
        }
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        logger.debug("controller connection error", metadata: ["error": "\(error)"])
        context.close(promise: nil)
    }

    private func request(_ head: HTTPRequestHead, context: ChannelHandlerContext) -> APIRequest {
        let parts = head.uri.split(separator: "?", maxSplits: 1)
        var query: [String: String] = [:]
        if parts.count > 1 {
            for pair in parts[1].split(separator: "&") {
                let kv = pair.split(separator: "=", maxSplits: 1)
                query[String(kv[0])] = kv.count > 1 ? String(kv[1]) : ""
            }
        }
        return APIRequest(
            method: head.method,
            path: parts.first.map(String.init) ?? "/",
            query: query,
            body: body,
            clientCertificate: clientCertificate(context),
            peer: context.channel.remoteAddress?.ipAddress ?? "unknown"
        )
    }

    private func write(_ response: APIResponse, keepAlive: Bool, context: ChannelHandlerContext) {
        var headers = HTTPHeaders()
        headers.add(name: "Content-Type", value: "application/json")
        headers.add(name: "Content-Length", value: String(response.body.count))
        headers.add(name: "Cache-Control", value: "no-store")
        if !keepAlive { headers.add(name: "Connection", value: "close") }
        context.write(
            wrapOutboundOut(
                .head(
                    HTTPResponseHead(
                        version: .http1_1,
                        status: response.status,
                        headers: headers
                    )
                )
            ),
            promise: nil
        )
        context.write(wrapOutboundOut(.body(.byteBuffer(ByteBuffer(bytes: response.body)))), promise: nil)
        let channel = context.channel
        context.writeAndFlush(wrapOutboundOut(.end(nil))).whenComplete { _ in
            if !keepAlive { channel.close(promise: nil) }
        }
        context.triggerUserOutboundEvent(APIRequestDeadlineHandler.Event.responseSent, promise: nil)
    }
}
