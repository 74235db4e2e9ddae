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

    /// Set by the circuit when it takes this path; nil again once it lets it go (`detach`). Weak: the circuit holds
    /// its path, and keeps itself alive until it closes as NIO's channels do (its pipeline holds it), so the two never
    /// hold each other.
    weak var circuit: CircuitChannel?
    private var context: ChannelHandlerContext?
    private var readHeld = false
    private var lingerTimer: Scheduled<Void>?
    /// While lingering: how long the peer may stay silent, and when the linger ends whatever the peer sends.
    private var lingering: (silence: TimeAmount, limit: NIODeadline)?
    /// The last write handed to the stream: a reset waits for it (`reset(within:)`).
    private var lastWrite: EventLoopFuture<Void>?

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
        let promise = promise ?? context.eventLoop.makePromise()
        lastWrite = promise.futureResult
        context.write(wrapOutboundOut(frame), promise: promise)
    }

    func flush() { context?.flush() }

    /// Resets the stream once what was written to it has left for the connection, or after `bound` at the latest
    /// (a peer whose window stays shut must not pin the stream).
    ///
    /// Not at once: swift-nio-http2 keeps a stream's DATA in its flow-control buffer while the connection is not
    /// writable, and a RST_STREAM discards that buffer. A circuit's last records, the CANCEL among them, then never
    /// reached the peer, which took the reset for a lost path and tried to resume a circuit this end had ended (the
    /// device reported `not_resumed` instead of `truncated`, and a gateway missed a device's cancel). The stream's
    /// frames leave in order, so once the last write has, so has everything before it.
    func reset(within bound: TimeAmount) {
        guard let context else { return }
        let channel = context.channel
        guard let lastWrite else {
            channel.close(promise: nil)
            return
        }
        let timer = context.eventLoop.assumeIsolated().scheduleTask(in: bound) { channel.close(promise: nil) }
        lastWrite.whenComplete { _ in
            timer.cancel()
            channel.close(promise: nil)
        }
    }

    func close(mode: CloseMode, promise: EventLoopPromise<Void>?) {
        guard let context else {
            promise?.fail(ChannelError.alreadyClosed)
            return
        }
        context.close(mode: mode, promise: promise)
    }

    /// A path its circuit let go of cleanly (END_STREAM sent): it closes by itself when the peer's END_STREAM
    /// comes, or is reset once the peer has sent nothing for `silence`, and at `limit` after now whatever it sends,
    /// so a peer that never ends its side cannot pin the stream.
    ///
    /// Each frame from the peer starts the silence again. A device takes an answer's last records after the
    /// gateway's circuit closed (what its window let out, up to the circuit's 3 MiB) and acknowledges them as it
    /// goes; a fixed 10 s reset the stream under a device still taking them on a loaded machine (as over a slow
    /// link), the tail was lost, and the device found no circuit to resume (CircuitEndTests, 4 MiB half-closed).
    func linger(silence: TimeAmount, limit: TimeAmount) {
        guard let context else { return }
        lingering = (silence, context.eventLoop.now + limit)
        armLinger(context)
    }

    private func armLinger(_ context: ChannelHandlerContext) {
        guard let lingering else { return }
        lingerTimer?.cancel()
        let channel = context.channel
        let due = min(context.eventLoop.now + lingering.silence, lingering.limit)
        lingerTimer = context.eventLoop.assumeIsolated().scheduleTask(deadline: due) { channel.close(promise: nil) }
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
        if lingering != nil { armLinger(context) }
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
