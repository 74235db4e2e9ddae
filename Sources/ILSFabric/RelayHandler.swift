public import NIOCore
public import NIOHTTP2

/// One half of the controller's splice between a device's circuit stream and a gateway's: DATA read here is
/// written to the partner stream, with END_STREAM carried across.
///
/// The two streams usually share an event loop (a gateway keeps a connection on each of the controller's loops and the
/// relay picks the one on the device connection's loop), and then a read burst is written to the partner at once; on
/// different loops the burst crosses threads in one hop. Reads stop while more than `maximumInFlight` bytes are written to the partner but not yet accepted by
/// it; the partner's HTTP/2 flow control holds those writes while its reader is slow, so a stalled circuit stops its
/// sender (through this stream's own window) and never grows the relay's memory, while other circuits on the same
/// connections flow.
/// The relay only ever sees ciphertext.
public final class RelayHandler: ChannelDuplexHandler, RemovableChannelHandler {
    public typealias InboundIn = HTTP2Frame.FramePayload
    public typealias OutboundIn = HTTP2Frame.FramePayload
    public typealias OutboundOut = HTTP2Frame.FramePayload

    public static let maximumInFlight = 256 * 1024

    private let partner: any Channel
    private var inFlight = 0
    private var pendingRead = false
    /// DATA read in the current read burst, not yet handed to the partner.
    private var batch: [HTTP2Frame.FramePayload] = []
    private var batchBytes = 0
    /// This stream's sender ended its direction (END_STREAM read): the stream may now close cleanly.
    private var sawEnd = false
    /// Completes when the last batch handed to the partner has been written there.
    private var lastWrite: EventLoopFuture<Void>?
    private var context: ChannelHandlerContext?
    /// Counts relayed bytes, for session listings (`admin sessions`).
    private let onBytes: (@Sendable (Int) -> Void)?
    /// Whether the relay has cut the circuit (a policy change): what this stream reads after that is dropped, not
    /// passed to the partner, whose reset with its reason is on its way.
    private let isSevered: (@Sendable () -> Bool)?

    public init(
        partner: any Channel,
        onBytes: (@Sendable (Int) -> Void)? = nil,
        isSevered: (@Sendable () -> Bool)? = nil
    ) {
        self.partner = partner
        self.isSevered = isSevered
        self.onBytes = onBytes
    }

    public func handlerAdded(context: ChannelHandlerContext) {
        self.context = context
    }

    public func handlerRemoved(context: ChannelHandlerContext) {
        self.context = nil
    }

    public func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        guard case .data(var payload) = unwrapInboundIn(data) else { return }
        if payload.endStream { sawEnd = true }
        let size = payload.data.readableBytes
        inFlight += size
        onBytes?(size)
        // Held until the partner's loop has written it: detached from the HTTP/2 decoder's buffer (see
        // `StreamDataCodec.detached`).
        if case .byteBuffer(let buffer) = payload.data, size > 0 {
            payload.data = .byteBuffer(StreamDataCodec.detached(buffer, allocator: context.channel.allocator))
        }
        batch.append(.data(payload))
        batchBytes += size
    }

    /// Hands everything read in this burst to the partner with one flush and one completion: directly when the
    /// partner shares this event loop, else in one hop to its loop (not a cross-thread write, flush and callback per
    /// frame).
    public func channelReadComplete(context: ChannelHandlerContext) {
        sendBatch(context: context)
        context.fireChannelReadComplete()
    }

    private func sendBatch(context: ChannelHandlerContext) {
        guard !batch.isEmpty else { return }
        // Asked once a read burst, not per frame: a cut circuit's burst is dropped whole.
        if isSevered?() == true {
            inFlight -= batchBytes
            batch = []
            batchBytes = 0
            return
        }
        let frames = batch
        let size = batchBytes
        batch = []
        batchBytes = 0
        let partner = self.partner
        let loop = NIOLoopBound(self, eventLoop: context.eventLoop)
        let eventLoop = context.eventLoop
        let written = partner.eventLoop.makePromise(of: Void.self)
        let send: @Sendable () -> Void = {
            for frame in frames.dropLast() { partner.write(frame, promise: nil) }
            partner.writeAndFlush(frames.last!, promise: written)
        }
        if partner.eventLoop === eventLoop { send() } else { partner.eventLoop.execute(send) }
        lastWrite = written.futureResult
        written.futureResult.whenComplete { result in
            // Deferred to a later tick even on the same loop: the completion may fire inside the partner's write.
            eventLoop.execute {
                let handler = loop.value
                handler.inFlight -= size
                if case .failure = result {
                    handler.context?.close(promise: nil)
                    return
                }
                if handler.pendingRead, handler.inFlight < Self.maximumInFlight, let context = handler.context {
                    handler.pendingRead = false
                    context.read()
                }
            }
        }
    }

    public func read(context: ChannelHandlerContext) {
        if inFlight < Self.maximumInFlight {
            context.read()
        } else {
            pendingRead = true
        }
    }

    /// How long a stream that ended without END_STREAM (a reset, a lost connection) waits for what was relayed to
    /// be written to its partner before the partner is reset all the same.
    public static let resetLinger: TimeAmount = .seconds(10)

    /// The partner is closed only once what was relayed has been written there: its writes may be waiting on its
    /// reader's flow-control window, or in swift-nio-http2's buffer while its connection is not writable, and a
    /// reset at once would discard them, cutting the tail of the circuit that the relay had already accepted (a
    /// FINAL record, or the CANCEL that tells the other end the circuit was ended on purpose and is not to be
    /// resumed). After a clean end (END_STREAM read: both directions over) it waits for as long as that takes;
    /// after a reset or a lost connection, up to `resetLinger`.
    ///
    /// A cut circuit's partner is not closed here: its end is the cut's (`Relay.cut` resets the device's stream with
    /// a code of its own, or closes it). The gateway ends a cut circuit itself as soon as it hears of it, and its
    /// stream's close, served on this loop before the cut's queued reset, reached the device first as a plain reset:
    /// the device took it for a lost path and asked for a resumption (CI, a narrowed device, once in a few runs).
    public func channelInactive(context: ChannelHandlerContext) {
        sendBatch(context: context)
        if isSevered?() == true {
            context.fireChannelInactive()
            return
        }
        let partner = self.partner
        if let lastWrite {
            let timer =
                sawEnd
                ? nil : partner.eventLoop.scheduleTask(in: Self.resetLinger) { partner.close(promise: nil) }
            lastWrite.whenComplete { _ in
                timer?.cancel()
                partner.close(promise: nil)
            }
        } else {
            partner.close(promise: nil)
        }
        context.fireChannelInactive()
    }

    public func errorCaught(context: ChannelHandlerContext, error: any Error) {
        context.close(promise: nil)
    }
}
