import ILSFabric
import NIOCore
import NIOHTTP1

/// Tells the end-to-end layer whether the proxy core's close of a circuit is a clean end or a cut.
///
/// The proxy core closes a connection the same way after a complete answer (`Connection: close`, an idle keep-alive
/// connection, its own error answer) and to abort one that cannot finish (the backend died mid-body, the client
/// stopped reading): over TCP, HTTP's own framing tells the two apart. Through a relay it cannot: the relay may
/// cut a stream as well, so the device only trusts the FINAL record (`E2EResponderHandler`). Sitting between the
/// HTTP server codec and the proxy core, this handler sees the requests come in and the responses go out: a close
/// between exchanges becomes a half-close (FINAL, END_STREAM); a close once a request came in and before its answer
/// ended stays a full close (RST_STREAM, no FINAL, so the device reports the answer as truncated).
///
/// After a half-close the circuit waits `lingerTimeout` for the device to end its side too (a stream closes once
/// both directions have ended), then is closed anyway: a device that keeps its side open must not pin it. A
/// resumable circuit whose path is lost meanwhile is not closed while it is held: its FINAL (and what came before it)
/// may not have reached the device, which resumes within the grace window to get them; the wait starts over once it
/// is back. (It was closed at the first `lingerTimeout`, so an answer that ended while its device was away lost its
/// tail, and the device's resumption was refused as for a circuit never held.)
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
        /// Between exchanges: a close now is a clean end.
        case idle
        /// A request's head came in and its answer's head has not gone out (the backend is being asked): a close
        /// now cuts the exchange. It was a clean end: a gateway that stopped then sent FINAL for an answer never
        /// given, and a held circuit lingered for its device for the whole grace window.
        case requested
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
        if case .head = unwrapInboundIn(data), case .idle = state { state = .requested }
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
            switch state {
            case .idle, .requested: state = .responding
            case .responding, .ended, .aborting: break
            }
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
        linger(context.channel)
        context.close(mode: .output, promise: promise)
    }

    /// Closes `channel` after `lingerTimeout`, unless it is a held circuit then: it waits for its device (its grace
    /// window bounds that), and the wait starts over.
    private func linger(_ channel: any Channel) {
        lingerTimer = channel.eventLoop.assumeIsolated().scheduleTask(in: lingerTimeout) {
            if let circuit = channel as? CircuitChannel, circuit.isHeld {
                self.linger(channel)
            } else {
                channel.close(promise: nil)
            }
        }
    }
}
