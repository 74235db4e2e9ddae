import NIOCore
import NIOHTTP1

/// Adds `Strict-Transport-Security: max-age=N` (RFC 6797 §6.1) to every final response of a TLS connection, the
/// gateway's own errors included: a browser that once reached the gateway over HTTPS then refuses to fall back to
/// cleartext for that host for `max-age` seconds. Only ever installed on TLS connections (§7.2: the header means
/// nothing over plain HTTP, and a client must ignore it there).
///
/// Sits between the response encoder and the proxy handler. After a `101 Switching Protocols` the connection
/// carries raw bytes, not response parts, so the handler leaves the pipeline as the 101 passes.
final class StrictTransportSecurityHandler: ChannelOutboundHandler, RemovableChannelHandler {
    typealias OutboundIn = HTTPServerResponsePart
    typealias OutboundOut = HTTPServerResponsePart

    static let headerName = "Strict-Transport-Security"

    private let value: String

    init(maxAgeSeconds: Int64) {
        value = "max-age=\(maxAgeSeconds)"
    }

    func write(context: ChannelHandlerContext, data: NIOAny, promise: EventLoopPromise<Void>?) {
        guard case .head(var head) = unwrapOutboundIn(data) else {
            context.write(data, promise: promise)
            return
        }
        if head.status == .switchingProtocols {
            context.write(data, promise: promise)
            context.pipeline.syncOperations.removeHandler(context: context, promise: nil)
            return
        }
        // 1xx answers are interim; the header belongs on the final response. A backend's own copy is replaced, so
        // the operator's setting is the one clients see.
        if head.status.code >= 200 {
            head.headers.replaceOrAdd(name: Self.headerName, value: value)
        }
        context.write(wrapOutboundOut(.head(head)), promise: promise)
    }
}

extension StrictTransportSecurityHandler {
    /// Puts the handler right behind the response encoder of a configured HTTP server pipeline.
    static func install(_ pipeline: ChannelPipeline.SynchronousOperations, maxAge: Int64) throws {
        let encoder = try pipeline.handler(type: HTTPResponseEncoder.self)
        try pipeline.addHandler(StrictTransportSecurityHandler(maxAgeSeconds: maxAge), position: .after(encoder))
    }
}
