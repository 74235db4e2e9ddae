public import NIOCore

/// Keeps an accepted socket registered for reads while the HTTP pipeline above it holds its reads for a while.
///
/// `HTTPServerPipelineHandler` holds reads from the end of each request until the end of its response (so that a
/// pipelined request waits its turn). A socket channel that has no read pending when a read burst ends asks epoll
/// to stop reporting it, and asks again when the next read comes: two `epoll_ctl` calls per request on every
/// keep-alive connection. This handler, first in the pipeline, always keeps one read pending at the socket, and
/// holds what arrives while the pipeline above is not reading: one read burst at most, after which it stops reading
/// for real (so it never holds more than the socket's read buffers of one burst). Held bytes go up, in order,
/// on the next loop turn after the pipeline reads again, and always before a close, an error or an event passes.
public final class ReadAheadHandler: ChannelDuplexHandler {
    public typealias InboundIn = ByteBuffer
    public typealias InboundOut = ByteBuffer
    public typealias OutboundIn = ByteBuffer

    /// The pipeline above asked to read and has not had a read burst since.
    private var upstreamReading = false
    /// Part of the current burst went up.
    private var deliveredInBurst = false
    /// Bytes that arrived while the pipeline above was not reading.
    private var held: [ByteBuffer] = []
    private var deliveryScheduled = false

    public init() {}

    public func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        if upstreamReading, held.isEmpty {
            deliveredInBurst = true
            context.fireChannelRead(data)
        } else {
            held.append(unwrapInboundIn(data))
        }
    }

    public func channelReadComplete(context: ChannelHandlerContext) {
        if deliveredInBurst {
            deliveredInBurst = false
            upstreamReading = false
            context.fireChannelReadComplete()
        } else if upstreamReading, held.isEmpty {
            context.fireChannelReadComplete()  // a burst with no bytes (end of file): nothing was consumed
        }
        guard held.isEmpty else { return }
        // Still inside the socket's read handling, so a read requested now keeps the socket registered. The channel
        // asks the pipeline for its next read (`autoRead`) only when no read is pending, so ask it here first, as the
        // channel would; if the pipeline holds that read, keep one pending at the socket anyway.
        if autoRead(context) { context.pipeline.read() }
        if !upstreamReading { context.read() }
    }

    public func read(context: ChannelHandlerContext) {
        upstreamReading = true
        if held.isEmpty {
            context.read()
        } else if !deliveryScheduled {
            // Not from inside `read`: a handler that asks to read does not expect data before its call returns.
            deliveryScheduled = true
            let handler = NIOLoopBound(self, eventLoop: context.eventLoop)
            let context = NIOLoopBound(context, eventLoop: context.eventLoop)
            context.value.eventLoop.execute {
                handler.value.deliveryScheduled = false
                guard handler.value.upstreamReading else { return }
                handler.value.deliverHeld(context: context.value)
            }
        }
    }

    /// Hands the held bytes up as one read burst, then asks for the next read as the socket would have.
    private func deliverHeld(context: ChannelHandlerContext) {
        guard !held.isEmpty else { return }
        upstreamReading = false
        flushHeld(context: context)
        guard context.channel.isActive else { return }
        if autoRead(context) { context.pipeline.read() }
        if !upstreamReading { context.read() }
    }

    private func autoRead(_ context: ChannelHandlerContext) -> Bool {
        (try? context.channel.syncOptions?.getOption(.autoRead)) ?? true
    }

    /// Hands the held bytes up before anything that must come after them.
    private func flushHeld(context: ChannelHandlerContext) {
        guard !held.isEmpty else { return }
        let burst = held
        held = []
        for buffer in burst { context.fireChannelRead(wrapInboundOut(buffer)) }
        context.fireChannelReadComplete()
    }

    public func channelInactive(context: ChannelHandlerContext) {
        flushHeld(context: context)
        context.fireChannelInactive()
    }

    public func errorCaught(context: ChannelHandlerContext, error: any Error) {
        flushHeld(context: context)
        context.fireErrorCaught(error)
    }

    public func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        flushHeld(context: context)
        context.fireUserInboundEventTriggered(event)
    }
}
