import ILSCrypto
public import NIOCore

/// The last handler of a circuit's stream (after `StreamDataCodec` and the frame decoder): hands the stream's frames
/// and events to the `CircuitChannel` whose path it is, and writes the circuit's frames to the stream.
///
/// Reads are the circuit's to ask for: a read the stream's own auto-read asks for is held until the circuit's
/// pipeline wants one (`demandRead`), so a proxy that stops reading a circuit stops the stream, and with it the
/// HTTP/2 window.
public final class CircuitPathHandler: ChannelDuplexHandler, RemovableChannelHandler {
    public typealias InboundIn = ByteBuffer
    public typealias OutboundIn = ByteBuffer
    public typealias OutboundOut = ByteBuffer

    /// Set by the circuit when it takes this path; nil again once it lets it go (`detach`).
    var circuit: CircuitChannel?
    private var context: ChannelHandlerContext?
    private var readHeld = false
    private var lingerTimer: Scheduled<Void>?

    /// Takes the path's first frame instead of the circuit: a resumption's RESUME or RESUMED, which attaches it.
    var onFirstFrame: ((CircuitPathHandler, ByteBuffer) -> Void)?

    public init() {}

    /// The stream, while this handler is in its pipeline.
    var channel: (any Channel)? { context?.channel }

    /// Answers with the refusal frame and closes the stream once it is out (a resumption refused).
    func refuse(_ reason: String) {
        guard let context else { return }
        let channel = context.channel
        let frame = E2ERecordLayer.frame(E2EHandshake.refusal(reason), allocator: channel.allocator)
        context.writeAndFlush(wrapOutboundOut(frame)).whenComplete { _ in channel.close(promise: nil) }
    }

    public func handlerAdded(context: ChannelHandlerContext) {
        self.context = context
    }

    public func handlerRemoved(context: ChannelHandlerContext) {
        self.context = nil
        lingerTimer?.cancel()
        lingerTimer = nil
    }

    /// The circuit no longer uses this path: nothing from it reaches the circuit any more.
    func detach() {
        circuit = nil
    }

    var isWritable: Bool { context?.channel.isWritable ?? false }

    func write(_ frame: ByteBuffer, promise: EventLoopPromise<Void>?) {
        guard let context else {
            promise?.fail(ChannelError.ioOnClosedChannel)
            return
        }
        context.write(wrapOutboundOut(frame), promise: promise)
    }

    func flush() { context?.flush() }

    func close(mode: CloseMode, promise: EventLoopPromise<Void>?) {
        guard let context else {
            promise?.fail(ChannelError.alreadyClosed)
            return
        }
        context.close(mode: mode, promise: promise)
    }

    /// A path its circuit let go of cleanly (END_STREAM sent): it closes by itself when the peer's END_STREAM
    /// comes, or is reset after `timeout`, so a peer that never ends its side cannot pin the stream.
    func linger(_ timeout: TimeAmount) {
        guard let context else { return }
        let channel = context.channel
        lingerTimer = context.eventLoop.assumeIsolated().scheduleTask(in: timeout) { channel.close(promise: nil) }
    }

    func triggerOutbound(_ event: Any, promise: EventLoopPromise<Void>?) {
        guard let context else {
            promise?.fail(ChannelError.ioOnClosedChannel)
            return
        }
        context.triggerUserOutboundEvent(event, promise: promise)
    }

    func demandRead() {
        guard readHeld, let context else { return }
        readHeld = false
        context.read()
    }

    public func read(context: ChannelHandlerContext) {
        // Before a circuit takes the path (a resumption's first message) the path reads for itself.
        if circuit?.readDemanded ?? true {
            context.read()
        } else {
            readHeld = true
        }
    }

    public func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        if let first = onFirstFrame {
            onFirstFrame = nil
            first(self, unwrapInboundIn(data))
            return
        }
        circuit?.pathRead(self, unwrapInboundIn(data))
    }

    public func channelReadComplete(context: ChannelHandlerContext) {
        circuit?.pathReadComplete(self)
    }

    public func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        if case ChannelEvent.inputClosed = event {
            circuit?.pathInputClosed(self)
        }
    }

    public func errorCaught(context: ChannelHandlerContext, error: any Error) {
        circuit?.pathError(self, error)
    }

    public func channelWritabilityChanged(context: ChannelHandlerContext) {
        circuit?.pathWritabilityChanged(self)
    }

    public func channelInactive(context: ChannelHandlerContext) {
        let circuit = self.circuit
        self.circuit = nil
        circuit?.pathInactive(self)
    }
}
