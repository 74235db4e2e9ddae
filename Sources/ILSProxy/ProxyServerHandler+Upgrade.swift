import ILSFabric
import NIOCore
import NIOHTTP1

extension ProxyServerHandler {
    /// The backend accepted a protocol switch (RFC 9110 §15.2.2): from here on both connections carry opaque bytes.
    ///
    /// A `ByteToMessageHandler` leaves its pipeline one event-loop tick after it is asked to, and whatever it
    /// holds then is dropped (the client side: the server codec forwards leftovers only to NIO's own upgrader) or
    /// forwarded without a read-complete (the backend side). Any read of either channel in that tick lands in the
    /// leaving decoder. So the switch happens in two steps:
    /// 1. the client's request decoder leaves first, before the client sees the 101, so the client has no reason to
    ///    send a byte of the new protocol while it is still there (a client that sends before the 101 breaks RFC
    ///    6455 §4.1, and those bytes are dropped, never parsed as HTTP);
    /// 2. once it is gone: the 101 is written, the glue pair is installed on both channels and the other HTTP
    ///    handlers leave. Bytes the backend's decoder still holds (sent right after its 101, or an answer that
    ///    arrived in its last tick) are forwarded to the glue when it goes, and flushed to the client then.
    func upgrade(_ exchange: Exchange, backend: BackendHandler, head: HTTPResponseHead) {
        guard let context, let backendChannel = backend.channel else { return }
        backend.delegate = nil
        state = .upgraded
        exchange.status = head.status
        let decoderGone = context.eventLoop.makePromise(of: Void.self)
        let pipeline = context.pipeline.syncOperations
        if let decoder = try? pipeline.context(handlerType: ByteToMessageHandler<HTTPRequestDecoder>.self) {
            pipeline.removeHandler(context: decoder, promise: decoderGone)
        } else {
            decoderGone.succeed()
        }
        decoderGone.futureResult.assumeIsolated().whenComplete { _ in
            self.switchProtocols(exchange, backendChannel: backendChannel, head: head)
        }
    }

    private func switchProtocols(_ exchange: Exchange, backendChannel: any Channel, head: HTTPResponseHead) {
        guard let context, case .upgraded = state, context.channel.isActive, backendChannel.isActive else {
            // One side went away while the request decoder was leaving: nothing was switched, end both.
            accessLog.record(exchange, client: client, outcome: "client_closed")
            backendChannel.close(promise: nil)
            self.context?.channel.close(promise: nil)
            return
        }
        exchange.responseHeadSent = true
        let clientHead = HeaderRewriter.clientResponse(head, requestVersion: exchange.requestVersion, closeAfter: false)
        context.writeAndFlush(wrapOutboundOut(.head(clientHead)), promise: nil)

        let clientChannel = context.channel
        let (clientGlue, backendGlue) = GlueHandler.matchedPair()
        do {
            let clientPipeline = context.pipeline.syncOperations
            let backendPipeline = backendChannel.pipeline.syncOperations
            try clientPipeline.addHandler(clientGlue)
            try backendPipeline.addHandler(backendGlue)
            try clientPipeline.removeIfPresent(HTTPServerPipelineHandler.self)
            try clientPipeline.removeIfPresent(NIOHTTPResponseHeadersValidator.self)
            try clientPipeline.removeIfPresent(HTTPResponseEncoder.self)
            try clientPipeline.removeIfPresent(ProxyServerHandler.self)
            try backendPipeline.removeIfPresent(BackendHandler.self)
            try backendPipeline.removeIfPresent(NIOHTTPRequestHeadersValidator.self)
            try backendPipeline.removeIfPresent(HTTPRequestEncoder.self)
            let backendDecoderGone = backendChannel.eventLoop.makePromise(of: Void.self)
            try backendPipeline.removeIfPresent(
                ByteToMessageHandler<HTTPResponseDecoder>.self,
                promise: backendDecoderGone
            )
            backendDecoderGone.futureResult.whenComplete { _ in clientChannel.flush() }
        } catch {
            logger.error("could not switch protocols", metadata: ["error": "\(error)"])
            backendChannel.close(promise: nil)
            context.channel.close(promise: nil)
            return
        }
        accessLog.record(exchange, client: client, outcome: "upgraded")
        // Reads held by the HTTP handlers are gone with them; ask again so neither side stalls.
        backendChannel.read()
        clientChannel.read()
    }
}

extension ChannelPipeline.SynchronousOperations {
    /// Removes the handler of `type` if the pipeline has one; `promise` completes when it has left (at once if there
    /// is none).
    fileprivate func removeIfPresent<Handler: RemovableChannelHandler>(
        _ type: Handler.Type,
        promise: EventLoopPromise<Void>? = nil
    ) throws {
        guard let context = try? self.context(handlerType: type) else {
            promise?.succeed()
            return
        }
        self.removeHandler(context: context, promise: promise)
    }
}
