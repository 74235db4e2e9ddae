import ILSFabric
import NIOCore
import NIOHTTP1

extension ProxyServerHandler {
    /// The backend accepted a protocol switch (RFC 9110 §15.2.2): from here on both connections carry opaque bytes.
    ///
    /// Everything happens in one event-loop tick: the 101 is written, the glue pair is installed on both channels,
    /// then the HTTP handlers leave both pipelines. No client read can run in between, so no byte of the new protocol
    /// is ever parsed as HTTP. Bytes the backend sent right after its 101 are forwarded by its decoder on removal.
    func upgrade(_ exchange: Exchange, backend: BackendHandler, head: HTTPResponseHead) {
        guard let context, let backendChannel = backend.channel else { return }
        backend.delegate = nil
        state = .upgraded
        exchange.status = head.status
        exchange.responseHeadSent = true
        let clientHead = HeaderRewriter.clientResponse(head, requestVersion: exchange.requestVersion, closeAfter: false)
        context.writeAndFlush(wrapOutboundOut(.head(clientHead)), promise: nil)

        let (clientGlue, backendGlue) = GlueHandler.matchedPair()
        do {
            let clientPipeline = context.pipeline.syncOperations
            let backendPipeline = backendChannel.pipeline.syncOperations
            try clientPipeline.addHandler(clientGlue)
            try backendPipeline.addHandler(backendGlue)
            try clientPipeline.removeIfPresent(HTTPServerPipelineHandler.self)
            try clientPipeline.removeIfPresent(NIOHTTPResponseHeadersValidator.self)
            try clientPipeline.removeIfPresent(ByteToMessageHandler<HTTPRequestDecoder>.self)
            try clientPipeline.removeIfPresent(HTTPResponseEncoder.self)
            try clientPipeline.removeIfPresent(ProxyServerHandler.self)
            try backendPipeline.removeIfPresent(BackendHandler.self)
            try backendPipeline.removeIfPresent(NIOHTTPRequestHeadersValidator.self)
            try backendPipeline.removeIfPresent(HTTPRequestEncoder.self)
            try backendPipeline.removeIfPresent(ByteToMessageHandler<HTTPResponseDecoder>.self)
        } catch {
            logger.error("could not switch protocols", metadata: ["error": "\(error)"])
            backendChannel.close(promise: nil)
            context.channel.close(promise: nil)
            return
        }
        accessLog.record(exchange, client: client, outcome: "upgraded")
        // Reads held by the HTTP handlers are gone with them; ask again so neither side stalls.
        backendChannel.read()
        context.channel.read()
    }
}

extension ChannelPipeline.SynchronousOperations {
    fileprivate func removeIfPresent<Handler: RemovableChannelHandler>(_ type: Handler.Type) throws {
        guard let context = try? self.context(handlerType: type) else { return }
        self.removeHandler(context: context, promise: nil)
    }
}
