public import NIOCore
public import NIOHTTP2

/// How an overlay connection finds out that its peer is gone when nothing says so.
///
/// A home router or a mobile carrier drops an idle TCP mapping after minutes (carriers: sometimes seconds) and says
/// nothing to either end. Before this, a gateway whose mapping was dropped never noticed (it had nothing to send),
/// and the controller kept routing circuits to it, each failing only after the relay's 5 s gateway timeout: the
/// service was down until someone restarted the gateway.
public struct FabricKeepalive: Sendable, Hashable {
    /// How long a connection may receive nothing before it sends a PING. 25 s keeps a NAT mapping alive under the
    /// common 30 s UDP/60 s+ TCP timeouts of home routers and carriers (RFC 5382 REQ-5 asks for ≥ 2 h 4 min, but many
    /// devices use far less), while costing an idle device one 17-byte frame (plus TLS) each way every 25 s.
    public var interval: TimeAmount
    /// How long after its PING a connection that has still received nothing is declared dead and closed.
    public var timeout: TimeAmount

    public init(interval: TimeAmount, timeout: TimeAmount) {
        self.interval = interval
        self.timeout = timeout
    }

    public static let standard = FabricKeepalive(interval: .seconds(25), timeout: .seconds(10))

    /// Asks a connection's `KeepaliveHandler` to check its peer now (a PING unless one is out or a frame arrived in
    /// the last `fresh`), and to close the connection if no frame answers within the timeout. Sent as an outbound
    /// user event on the connection's channel, by whoever suspects it: the relay after a gateway did not take a
    /// circuit, a device before it dials on a connection that has been quiet.
    public struct Probe: Sendable {
        public var fresh: TimeAmount
        public init(fresh: TimeAmount = .seconds(1)) { self.fresh = fresh }
    }
}

/// Keeps an overlay connection's liveness known: after `interval` with nothing received it sends an HTTP/2 PING
/// (RFC 9113 §6.7: the peer must answer with an ACK), and if nothing at all arrives within `timeout` after that, it
/// closes the connection, so the owner redials (gateway, tunnel, app) or stops routing to it (the relay). Any frame
/// read counts as a sign of life, not only the ACK: a busy connection never pings.
///
/// Sits after the `NIOHTTP2Handler` in the connection's pipeline, where it sees the root stream's frames and every
/// read-complete, and writes its PINGs through the HTTP/2 handler. Not swift-nio-http2's
/// `NIOHTTP2ServerConnectionManagementHandler`: that one runs on the HTTP/2 server side only (a device's connection
/// and the controller's end of a gateway link are clients) and answers a missed PING with a graceful GOAWAY that waits
/// for the dead peer to acknowledge it; a dead link must be closed at once.
///
/// Timers are lazy: one scheduled task per connection at a time, re-armed only when it fires, never per read.
public final class KeepaliveHandler: ChannelDuplexHandler {
    public typealias InboundIn = HTTP2Frame
    public typealias InboundOut = HTTP2Frame
    public typealias OutboundIn = HTTP2Frame
    public typealias OutboundOut = HTTP2Frame

    private let configuration: FabricKeepalive
    private let onDead: (@Sendable () -> Void)?
    /// When this side last read anything from the peer.
    private var lastRead = NIODeadline.uptimeNanoseconds(0)
    private var state = State.idle
    private var timer: Scheduled<Void>?
    private var context: ChannelHandlerContext?

    private enum State {
        /// Waiting for `interval` of silence.
        case idle
        /// A PING went out at this time; anything read after it means the peer is alive.
        case awaitingAnswer(sentAt: NIODeadline)
        case closed
    }

    /// The opaque 8 bytes of our PINGs (the ACK carries them back; we do not need to match them: any read will do).
    static let pingData = HTTP2PingData(withInteger: 0x696c_732d_6b61_6c76)  // "ils-kalv"

    /// - Parameter onDead: called once, on the connection's event loop, just before a connection that missed its
    ///   keepalive is closed (for a log line; the owner learns of the close from the channel as usual).
    public init(_ configuration: FabricKeepalive, onDead: (@Sendable () -> Void)? = nil) {
        self.configuration = configuration
        self.onDead = onDead
    }

    public func handlerAdded(context: ChannelHandlerContext) {
        self.context = context
        lastRead = context.eventLoop.now
        if context.channel.isActive { arm(at: lastRead + configuration.interval) }
    }

    public func handlerRemoved(context: ChannelHandlerContext) {
        state = .closed
        timer?.cancel()
        timer = nil
        self.context = nil
    }

    public func channelActive(context: ChannelHandlerContext) {
        lastRead = context.eventLoop.now
        arm(at: lastRead + configuration.interval)
        context.fireChannelActive()
    }

    public func channelInactive(context: ChannelHandlerContext) {
        state = .closed
        timer?.cancel()
        timer = nil
        context.fireChannelInactive()
    }

    public func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        lastRead = context.eventLoop.now
        context.fireChannelRead(data)
    }

    /// Every socket read burst ends in a read-complete that passes through here, whether its frames were for the root
    /// stream (seen in `channelRead`) or for circuits (which go to the stream channels, not to this handler).
    public func channelReadComplete(context: ChannelHandlerContext) {
        lastRead = context.eventLoop.now
        context.fireChannelReadComplete()
    }

    public func triggerUserOutboundEvent(context: ChannelHandlerContext, event: Any, promise: EventLoopPromise<Void>?) {
        guard let probe = event as? FabricKeepalive.Probe else {
            context.triggerUserOutboundEvent(event, promise: promise)
            return
        }
        promise?.succeed()
        guard case .idle = state, context.eventLoop.now - lastRead > probe.fresh else { return }
        sendPing(context: context)
    }

    private func arm(at deadline: NIODeadline) {
        guard let context, case .idle = state, timer == nil else { return }
        let loopBound = NIOLoopBound(self, eventLoop: context.eventLoop)
        timer = context.eventLoop.scheduleTask(deadline: deadline) {
            let handler = loopBound.value
            handler.timer = nil
            handler.fire()
        }
    }

    private func fire() {
        guard let context else { return }
        let now = context.eventLoop.now
        switch state {
        case .closed:
            return
        case .idle:
            if now - lastRead >= configuration.interval {
                sendPing(context: context)
            } else {
                arm(at: lastRead + configuration.interval)
            }
        case .awaitingAnswer(let sentAt):
            if lastRead >= sentAt {
                state = .idle
                arm(at: lastRead + configuration.interval)
            } else {
                state = .closed
                onDead?()
                // Not `context.close`: that goes through the TLS handler, which sends close_notify and waits up to 5 s
                // for the dead peer's (the relay kept routing circuits to the link, and the gateway waited to redial,
                // for those 5 s). `AbruptCloseHandler`, at the head of the pipeline, closes the socket at once.
                let promise = context.eventLoop.makePromise(of: Void.self)
                promise.futureResult.whenFailure { _ in context.close(promise: nil) }
                context.triggerUserOutboundEvent(AbruptCloseHandler.Close(), promise: promise)
            }
        }
    }

    private func sendPing(context: ChannelHandlerContext) {
        let sentAt = context.eventLoop.now
        state = .awaitingAnswer(sentAt: sentAt)
        timer?.cancel()
        let loopBound = NIOLoopBound(self, eventLoop: context.eventLoop)
        timer = context.eventLoop.scheduleTask(deadline: sentAt + configuration.timeout) {
            let handler = loopBound.value
            handler.timer = nil
            handler.fire()
        }
        let ping = HTTP2Frame(streamID: .rootStream, payload: .ping(Self.pingData, ack: false))
        context.writeAndFlush(wrapOutboundOut(ping), promise: nil)
    }
}

/// First in an overlay connection's pipeline, before TLS: closes the socket at once on `Close`, without the TLS
/// shutdown handshake that a close from further up would start. Only for a peer that is gone: it would never answer
/// the close_notify.
public final class AbruptCloseHandler: ChannelOutboundHandler, Sendable {
    public typealias OutboundIn = Any

    /// Sent as an outbound user event: close the connection now.
    public struct Close: Sendable {}

    public init() {}

    public func triggerUserOutboundEvent(context: ChannelHandlerContext, event: Any, promise: EventLoopPromise<Void>?) {
        guard event is Close else {
            context.triggerUserOutboundEvent(event, promise: promise)
            return
        }
        context.close(promise: promise)
    }
}
