import NIOCore
import NIOHTTP1

/// Hands the parts of an HTTP/1.1 response read from a circuit to one consumer, as it asks for them, and reads
/// from the circuit only while the consumer keeps up: a `read` is held while `highWater` parts wait, so a slow
/// consumer slows the gateway (and the backend behind it) instead of filling memory.
///
/// The response must end with its own `.end`: a circuit that closes or fails before it (a cut stream, a record that
/// does not open, a stream that ended without FINAL) is reported as a failure, never as a short but complete answer.
/// Nothing arriving for `idleTimeout` while the consumer waits fails it too (`timed_out`).
final class OverlayResponseReader: ChannelDuplexHandler, RemovableChannelHandler {
    typealias InboundIn = HTTPClientResponsePart
    typealias OutboundIn = HTTPClientRequestPart

    /// Where the response stands; each state holds only what it needs.
    private enum State {
        /// Parts are arriving; `waiter` is the consumer's pending `next`, if any.
        case reading(waiter: EventLoopPromise<HTTPClientResponsePart?>?)
        /// The response's `.end` was read; buffered parts are still handed out, then `nil`.
        case ended
        /// The circuit failed or closed early; buffered parts are handed out, then the error.
        case failed(any Error)
    }

    /// Enough parts to keep a fast consumer busy while the next read is out; small, since a part can be 64 KiB.
    static let highWater = 4

    private var state = State.reading(waiter: nil)
    private var buffer = CircularBuffer<HTTPClientResponsePart>()
    private var readHeld = false
    private var context: ChannelHandlerContext?
    private let idleTimeout: TimeAmount
    private var idleTimer: Scheduled<Void>?

    init(idleTimeout: TimeAmount) {
        self.idleTimeout = idleTimeout
    }

    func handlerAdded(context: ChannelHandlerContext) {
        self.context = context
        armIdleTimer(context)
        // The circuit may have closed between the dial and now; then no channelInactive is coming.
        if !context.channel.isActive { fail(ChannelError.eof) }
    }

    /// Breaks the handler ↔ context and handler ↔ timer cycles.
    func handlerRemoved(context: ChannelHandlerContext) {
        idleTimer?.cancel()
        idleTimer = nil
        self.context = nil
    }

    /// The next part of the response, `nil` after its end; fails if the circuit failed. Call on the event loop.
    func next(_ promise: EventLoopPromise<HTTPClientResponsePart?>) {
        if let part = buffer.popFirst() {
            promise.succeed(part)
            if readHeld, buffer.count < Self.highWater, let context {
                readHeld = false
                context.read()
            }
            return
        }
        switch state {
        case .reading(let waiter):
            waiter?.fail(ChannelError.inappropriateOperationForState)
            state = .reading(waiter: promise)
            if readHeld, let context {
                readHeld = false
                context.read()
            }
        case .ended:
            promise.succeed(nil)
        case .failed(let error):
            promise.fail(error)
        }
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        let part = unwrapInboundIn(data)
        armIdleTimer(context)
        guard case .reading(let waiter) = state else { return }
        // An interim answer (100 Continue, 103 Early Hints) is not the response (RFC 9110 §15.2): skip it.
        if case .head(let head) = part, (100..<200).contains(head.status.code), head.status != .switchingProtocols {
            return
        }
        var isEnd = false
        if case .end = part { isEnd = true }
        if let waiter {
            state = .reading(waiter: nil)
            waiter.succeed(part)
        } else {
            buffer.append(part)
        }
        guard isEnd, case .reading(let waiter) = state else { return }
        // The consumer may have asked again from inside `succeed`; it gets the end.
        stopIdleTimer()
        state = .ended
        waiter?.succeed(nil)
    }

    func read(context: ChannelHandlerContext) {
        if buffer.count >= Self.highWater {
            readHeld = true
        } else {
            context.read()
        }
    }

    func channelInactive(context: ChannelHandlerContext) {
        fail(ChannelError.eof)
        context.fireChannelInactive()
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        fail(error)
        context.close(promise: nil)
    }

    private func fail(_ error: any Error) {
        guard case .reading(let waiter) = state else { return }
        stopIdleTimer()
        state = .failed(error)
        // A waiter only exists while nothing is buffered, so it is owed the error now.
        waiter?.fail(error)
    }

    private func stopIdleTimer() {
        idleTimer?.cancel()
        idleTimer = nil
    }

    private func armIdleTimer(_ context: ChannelHandlerContext) {
        idleTimer?.cancel()
        guard case .reading = state else { return }
        let timeout = idleTimeout
        idleTimer = context.eventLoop.assumeIsolated().scheduleTask(in: timeout) { [weak self] in
            guard let self, let context = self.context else { return }
            // A consumer that is slow to ask holds the reads back; that is not the network going quiet.
            if self.readHeld || !self.buffer.isEmpty {
                self.armIdleTimer(context)
                return
            }
            self.fail(OverlayURLError.make(code: "timed_out", reason: "no data arrived for \(timeout)", url: nil))
            context.close(promise: nil)
        }
    }
}
