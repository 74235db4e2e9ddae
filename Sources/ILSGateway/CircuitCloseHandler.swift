import NIOCore
import NIOHTTP1

/// Tells the end-to-end layer whether the proxy core's close of a circuit is a clean end or a cut.
///
/// The proxy core closes a connection the same way after a complete answer (`Connection: close`, an idle keep-alive
/// connection, its own error answer) and to abort one that cannot finish (the backend died mid-body, the client
/// stopped reading): over TCP, HTTP's own framing tells the two apart. Through a relay it cannot: the relay may
/// cut a stream as well, so the device only trusts the FINAL record (`E2EResponderHandler`). Sitting between the
/// HTTP server codec and the proxy core, this handler sees the responses go out: a close while no response is in
/// progress becomes a half-close (FINAL, END_STREAM), a close mid-response stays a full close (RST_STREAM, no
/// FINAL, so the device reports the answer as truncated).
///
/// After a half-close the circuit waits `lingerTimeout` for the device to end its side too (a stream closes once
/// both directions have ended), then is closed anyway: a device that keeps its side open must not pin it.
/// Once ended, what the device still sends is dropped: the proxy core must not start an exchange it can no longer
/// answer. Leaves the pipeline at a `101 Switching Protocols`: from there the glue carries raw bytes and maps
/// half-closes across itself.
final class CircuitCloseHandler: ChannelDuplexHandler, RemovableChannelHandler {
    typealias InboundIn = HTTPServerRequestPart
    typealias InboundOut = HTTPServerRequestPart
    typealias OutboundIn = HTTPServerResponsePart
    typealias OutboundOut = HTTPServerResponsePart

    /// How long a cleanly ended circuit waits for the device's end before it is reset.
    static let lingerTimeout: TimeAmount = .seconds(5)

    private enum State {
        /// Between responses: a close now is a clean end.
        case idle
        /// A response's head went out and its end has not: a close now cuts it.
        case responding
        /// The clean end went out; the circuit waits for the device's end.
        case ended
        /// The gateway cuts the circuit whatever the exchange's state (`abort`).
        case aborting
    }

    private var state = State.idle
    private let lingerTimeout: TimeAmount
    private var lingerTimer: Scheduled<Void>?

    init(lingerTimeout: TimeAmount = CircuitCloseHandler.lingerTimeout) {
        self.lingerTimeout = lingerTimeout
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        lingerTimer?.cancel()
    }

    /// Closes `channel`, a circuit, abortively (RST_STREAM, no FINAL) even between two exchanges: a revoked
    /// identity's circuit ends at once, and its device must not take that end for a clean one.
    static func abort(_ channel: any Channel) {
        channel.eventLoop.execute {
            if let handler = try? channel.pipeline.syncOperations.handler(type: CircuitCloseHandler.self) {
                handler.state = .aborting
            }
            channel.close(promise: nil)
        }
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        if case .ended = state { return }
        context.fireChannelRead(data)
    }

    func write(context: ChannelHandlerContext, data: NIOAny, promise: EventLoopPromise<Void>?) {
        switch unwrapOutboundIn(data) {
        case .head(let head) where head.status == .switchingProtocols:
            context.write(data, promise: promise)
            context.pipeline.syncOperations.removeHandler(context: context, promise: nil)
        case .head(let head) where head.status.code < 200:
            // An interim answer (100 Continue): the real response is still to come.
            context.write(data, promise: promise)
        case .head:
            if case .idle = state { state = .responding }
            context.write(data, promise: promise)
        case .body:
            context.write(data, promise: promise)
        case .end:
            if case .responding = state { state = .idle }
            context.write(data, promise: promise)
        }
    }

    func close(context: ChannelHandlerContext, mode: CloseMode, promise: EventLoopPromise<Void>?) {
        guard mode == .all, case .idle = state else {
            context.close(mode: mode, promise: promise)
            return
        }
        state = .ended
        let channel = context.channel
        lingerTimer = context.eventLoop.scheduleTask(in: lingerTimeout) { channel.close(promise: nil) }
        context.close(mode: .output, promise: promise)
    }
}
