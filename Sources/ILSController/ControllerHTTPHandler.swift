import Foundation
import ILSCore
import Logging
import NIOCore
import NIOHTTP1
import NIOSSL

/// Collects one API request at a time (body bounded), asks the router, writes the JSON answer. Tells the
/// `APIRequestDeadlineHandler` below the codec where each request's head arrives and its answer goes out.
///
/// The router is asynchronous (the store is never called on an event loop): each request's answer is computed in a
/// task and written back on this channel's loop. `HTTPServerPipelineHandler` (pipelining assistance) holds the next
/// request until this one's answer is written, so answers go out in order.
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

    /// How an answer gets back to the loop: from a task (always, on a real event loop), or, for the fuzz targets'
    /// `EmbeddedChannel`, which only its own thread may touch, computed while that thread waits.
    package enum Answering: Sendable {
        case task
        case waitingOnCallerThread
    }

    private let answering: Answering

    init(
        router: ControllerRouter,
        logger: Logger,
        maximumBodyBytes: Int,
        answering: Answering = .task,
        clientCertificate: @escaping ClientCertificate
    ) {
        self.router = router
        self.answering = answering
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
            let keepAlive = head.isKeepAlive && !tooLarge
            if tooLarge {
                let response = ControllerRouter.failure(ILSError(.invalidArgument, "the request body is too large"))
                write(response, keepAlive: keepAlive, context: context)
                return
            }
            let router = self.router
            let request = request(head, context: context)
            guard answering == .task else {
                write(Self.waitForAnswer(router, request), keepAlive: keepAlive, context: context)
                return
            }
            let answer = context.eventLoop.makePromise(of: APIResponse.self)
            answer.completeWithTask { await router.handle(request) }
            let bound = NIOLoopBound((handler: self, context: context), eventLoop: context.eventLoop)
            answer.futureResult.whenSuccess { response in
                guard bound.value.context.channel.isActive else { return }
                bound.value.handler.write(response, keepAlive: keepAlive, context: bound.value.context)
            }
        }
    }

    /// Blocks the calling thread until the router answers: only for `.waitingOnCallerThread`, never on an event loop.
    private static func waitForAnswer(_ router: ControllerRouter, _ request: APIRequest) -> APIResponse {
        CallerThread.wait { await router.handle(request) }
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
                // Values are percent-decoded (an audit filter may hold any visible character); one that does not
                // decode is kept as sent and refused by whatever checks it.
                let value = kv.count > 1 ? String(kv[1]) : ""
                query[String(kv[0])] = value.removingPercentEncoding ?? value
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
        if let controllers = response.controllers {
            headers.add(name: ControllerAddress.listHeader, value: ControllerAddress.header(controllers))
        }
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
