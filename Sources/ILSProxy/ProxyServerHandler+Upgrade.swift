import ILSSplice
import NIOCore
import NIOHTTP1

extension ProxyServerHandler {
    /// The backend accepted a protocol switch (RFC 9110 §15.2.2): from here on both connections carry opaque bytes.
    ///
    /// The HTTP decoders are `ByteToMessageHandler`s, which leave a pipeline one event-loop tick after they are asked
    /// to; until then every byte read on their channel still goes into them, and a raw write towards the backend
    /// would reach the response decoder's write side (a crash). So the switch waits for both to be gone before the
    /// client sees the 101, and only then do bytes flow:
    /// 1. now: the other HTTP handlers leave the backend connection, a `SwitchHold` takes their place to keep what
    ///    the backend sends with or after its 101 (its decoder forwards those bytes when it goes), and both
    ///    decoders are asked to leave. The client has no 101 yet, so it has nothing to send (bytes a client sends
    ///    before the 101 break RFC 6455 §4.1; they are dropped, never parsed as HTTP);
    /// 2. once both are gone: the 101 is written, the glue pair is installed, the client's HTTP handlers leave, the
    ///    held backend bytes go to the client, and reads resume on both sides.
    func upgrade(_ exchange: Exchange, backend: BackendHandler, head: HTTPResponseHead) {
        guard let context, let backendChannel = backend.channel else { return }
        backend.delegate = nil
        let hold = SwitchHold()
        let clientDecoderGone = context.eventLoop.makePromise(of: Void.self)
        let backendDecoderGone = context.eventLoop.makePromise(of: Void.self)
        do {
            let clientPipeline = context.pipeline.syncOperations
            let backendPipeline = backendChannel.pipeline.syncOperations
            try backendPipeline.removeIfPresent(BackendHandler.self)
            try backendPipeline.removeIfPresent(NIOHTTPRequestHeadersValidator.self)
            try backendPipeline.removeIfPresent(HTTPRequestEncoder.self)
            try backendPipeline.addHandler(hold)
            try backendPipeline.removeIfPresent(
                ByteToMessageHandler<HTTPResponseDecoder>.self,
                promise: backendDecoderGone
            )
            try clientPipeline.removeIfPresent(
                ByteToMessageHandler<HTTPRequestDecoder>.self,
                promise: clientDecoderGone
            )
        } catch {
            logger.error("could not switch protocols", metadata: ["error": "\(error)"])
            backendChannel.close(promise: nil)
            context.channel.close(promise: nil)
            return
        }
        clientDecoderGone.futureResult.and(backendDecoderGone.futureResult).assumeIsolated().whenComplete { _ in
            self.switchProtocols(exchange, backendChannel: backendChannel, hold: hold, head: head)
        }
    }

    private func switchProtocols(
        _ exchange: Exchange,
        backendChannel: any Channel,
        hold: SwitchHold,
        head: HTTPResponseHead
    ) {
        guard let context, case .upgrading = machine.state, context.channel.isActive else {
            // The client went away while the decoders were leaving: nothing was switched.
            accessLog.record(exchange, client: client, outcome: "client_closed")
            backendChannel.close(promise: nil)
            return
        }
        let clientHead = HeaderRewriter.clientResponse(head, requestVersion: exchange.requestVersion, closeAfter: false)
        context.write(wrapOutboundOut(.head(clientHead)), promise: nil)
        let clientChannel = context.channel
        guard backendChannel.isActive else {
            // The backend sent its 101 (and maybe more) and closed at once: deliver what it sent, then close.
            accessLog.record(exchange, client: client, outcome: "upgraded")
            let pipeline = context.pipeline.syncOperations
            try? pipeline.removeIfPresent(HTTPServerPipelineHandler.self)
            try? pipeline.removeIfPresent(NIOHTTPResponseHeadersValidator.self)
            try? pipeline.removeIfPresent(HTTPResponseEncoder.self)
            if let held = hold.take() { context.write(NIOAny(held), promise: nil) }
            context.flush()
            context.close(promise: nil)
            return
        }
        context.flush()
        let (clientGlue, backendGlue) = GlueHandler.matchedPair()
        do {
            let clientPipeline = context.pipeline.syncOperations
            try clientPipeline.addHandler(clientGlue)
            try backendChannel.pipeline.syncOperations.addHandler(backendGlue)
            try clientPipeline.removeIfPresent(HTTPServerPipelineHandler.self)
            try clientPipeline.removeIfPresent(NIOHTTPResponseHeadersValidator.self)
            try clientPipeline.removeIfPresent(HTTPResponseEncoder.self)
            try clientPipeline.removeIfPresent(ProxyServerHandler.self)
            hold.release()
            try backendChannel.pipeline.syncOperations.removeIfPresent(SwitchHold.self)
        } catch {
            logger.error("could not switch protocols", metadata: ["error": "\(error)"])
            backendChannel.close(promise: nil)
            clientChannel.close(promise: nil)
            return
        }
        accessLog.record(exchange, client: client, outcome: "upgraded")
        // Reads held by the HTTP handlers are gone with them; ask again so neither side stalls.
        backendChannel.read()
        clientChannel.read()
    }
}

/// Keeps what a backend sends with or right after its 101 while the switch is under way (its decoder forwards those
/// bytes when it leaves), until `release` hands them on as one read burst to the glue installed after it.
final class SwitchHold: ChannelInboundHandler, RemovableChannelHandler {
    typealias InboundIn = ByteBuffer
    typealias InboundOut = ByteBuffer

    private var held: ByteBuffer?
    private var context: ChannelHandlerContext?

    func handlerAdded(context: ChannelHandlerContext) { self.context = context }

    func handlerRemoved(context: ChannelHandlerContext) { self.context = nil }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        var bytes = unwrapInboundIn(data)
        if held == nil {
            held = bytes
        } else {
            held!.writeBuffer(&bytes)
        }
    }

    /// What was held, for a caller that delivers it itself.
    func take() -> ByteBuffer? {
        defer { held = nil }
        return held
    }

    /// Passes what was held to the next handler.
    func release() {
        guard let context, let held = take() else { return }
        context.fireChannelRead(wrapInboundOut(held))
        context.fireChannelReadComplete()
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
