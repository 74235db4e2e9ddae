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

    /// What a device's connection does while no circuit is open: it sends no PING, so a phone's radio can sleep,
    /// and after `closeAfter` (nil: never) it closes, so nothing is held either.
    public struct Idle: Sendable, Hashable {
        public var closeAfter: TimeAmount?
        public init(closeAfter: TimeAmount?) { self.closeAfter = closeAfter }

        /// 15 s: longer than the pause between an answer and the app's next request in a conversation (which then
        /// finds the connection open: a warm request, about two round trips fewer than a cold one), shorter than the
        /// keepalive interval (an idle device never pings) and than the 30 s within which the strictest NATs drop a
        /// silent TCP mapping (a connection kept longer without PINGs could be dead when the next request comes).
        public static let standard = Idle(closeAfter: .seconds(15))

        /// How long a new connection may wait for its first circuit (or a probe, which comes with one) before the
        /// idle close applies: its TLS handshake comes first, and a loaded device may take longer than a short idle
        /// time for it.
        public static let unused: TimeAmount = .seconds(30)
    }

    /// Asks a connection's `KeepaliveHandler` to check its peer now (a PING unless one is out or a frame arrived in
    /// the last `fresh`), and to close the connection if no frame answers within the timeout. Sent as an outbound
    /// user event on the connection's channel, by whoever suspects it: the relay after a gateway did not take a
    /// circuit, a device before it dials on a connection that has been quiet.
    public struct Probe: Sendable {
        public var fresh: TimeAmount
        public init(fresh: TimeAmount = .seconds(1)) { self.fresh = fresh }
    }

    /// Asks a connection that counts its streams (a device's, with an idle policy) to complete the event's promise
    /// once no stream is open on it: every circuit ended on the wire, a cancelled one's CANCEL and reset written to the
    /// connection. At once when none is open or the connection does not count them; failed if the connection closes
    /// first, or is closed already. Sent as an outbound user event on the connection's channel
    /// (`OverlayDialer.circuitsEnded(within:)`).
    public struct StreamsEnded: Sendable {
        public init() {}
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
    /// A device's connection: PINGs only while a stream is open, and closed after `idle.closeAfter` without one.
    private let idle: FabricKeepalive.Idle?
    /// Streams open on the connection now (counted only with `idle`, through `streamCounter`).
    private var openStreams = 0
    private var idleTimer: Scheduled<Void>?
    /// `StreamsEnded` events waiting for the last open stream to close.
    private var streamsEndedWaiters: [EventLoopPromise<Void>] = []
    /// Told `true` when the interval's PING goes out (nothing received for the interval), `false` when anything
    /// arrives after it: a device's link state (`stalled`).
    private let onSilence: (@Sendable (Bool) -> Void)?
    private var reportedSilent = false
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
    /// - Parameters:
    ///   - idle: for a device's connection: no PING while no stream is open, and the connection closed after
    ///     `idle.closeAfter` without one (nil: PINGs whenever the connection is quiet, as gateways and the controller
    ///     need). The connection's HTTP/2 handler must then report its streams here (`configureFabricHTTP2` does).
    ///   - onDead: called once, on the connection's event loop, just before a connection that missed its keepalive is
    ///     closed (for a log line; the owner learns of the close from the channel as usual).
    ///   - onSilence: told `true` when the interval's PING goes out, `false` when anything arrives after it.
    public init(
        _ configuration: FabricKeepalive,
        idle: FabricKeepalive.Idle? = nil,
        onDead: (@Sendable () -> Void)? = nil,
        onSilence: (@Sendable (Bool) -> Void)? = nil
    ) {
        self.configuration = configuration
        self.idle = idle
        self.onSilence = onSilence
        self.onDead = onDead
    }

    /// Whether the handler counts the connection's streams (it has an idle policy).
    var countsStreams: Bool { idle != nil }

    public func handlerAdded(context: ChannelHandlerContext) {
        self.context = context
        lastRead = context.eventLoop.now
        if context.channel.isActive { started(context: context) }
    }

    public func handlerRemoved(context: ChannelHandlerContext) {
        stopTimers()
        self.context = nil
    }

    public func channelActive(context: ChannelHandlerContext) {
        lastRead = context.eventLoop.now
        started(context: context)
        context.fireChannelActive()
    }

    public func channelInactive(context: ChannelHandlerContext) {
        stopTimers()
        context.fireChannelInactive()
    }

    private func started(context: ChannelHandlerContext) {
        if pings { arm(at: lastRead + configuration.interval) }
        // Not yet the idle time: the TLS handshake and the first circuit come after the connection is up, and a slow
        // handshake on a loaded device must not be cut by a short idle time. A connection that is never used still
        // closes, after `FabricKeepalive.Idle.unused` at the least.
        if openStreams == 0 { armIdleClose(context: context, atLeast: FabricKeepalive.Idle.unused) }
    }

    private func stopTimers() {
        state = .closed
        timer?.cancel()
        timer = nil
        idleTimer?.cancel()
        idleTimer = nil
        // The connection is gone with streams still open: what they had not written never will be.
        streamsEnded(closed: true)
    }

    private func streamsEnded(closed: Bool = false) {
        let waiters = streamsEndedWaiters
        streamsEndedWaiters = []
        for waiter in waiters {
            if closed { waiter.fail(ChannelError.ioOnClosedChannel) } else { waiter.succeed() }
        }
    }

    /// Whether a quiet connection is probed now: always, or with an idle policy only while a stream is open. An idle
    /// device sends nothing, so its radio sleeps; a NAT mapping that lapses meanwhile is found by the PING sent with
    /// the next circuit (`FabricKeepalive.Probe`), or never matters when the connection is closed first.
    private var pings: Bool { idle == nil || openStreams > 0 }

    /// A stream opened on the connection (`streamCounter`).
    func streamOpened() {
        openStreams += 1
        idleTimer?.cancel()
        idleTimer = nil
        if openStreams == 1, case .idle = state { arm(at: lastRead + configuration.interval) }
    }

    /// A stream closed on the connection (`streamCounter`).
    func streamClosed() {
        openStreams = max(openStreams - 1, 0)
        guard openStreams == 0 else { return }
        streamsEnded()
        if let context { armIdleClose(context: context) }
    }

    /// Closes the connection after the idle policy's time (and `atLeast`) without a stream, counted from now.
    private func armIdleClose(context: ChannelHandlerContext, atLeast: TimeAmount = .zero) {
        guard let closeAfter = idle?.closeAfter, context.channel.isActive else { return }
        idleTimer?.cancel()
        let loopBound = NIOLoopBound(self, eventLoop: context.eventLoop)
        idleTimer = context.eventLoop.scheduleTask(in: max(closeAfter, atLeast)) {
            let handler = loopBound.value
            handler.idleTimer = nil
            guard handler.openStreams == 0, let context = handler.context else { return }
            handler.stopTimers()
            context.close(promise: nil)
        }
    }

    /// Reports the connection's streams to `handler`, on its event loop (an idle policy needs the count).
    public static func streamCounter(for handler: KeepaliveHandler, on eventLoop: any EventLoop)
        -> any NIOHTTP2StreamDelegate
    {
        StreamCounter(handler: NIOLoopBound(handler, eventLoop: eventLoop))
    }

    private struct StreamCounter: NIOHTTP2StreamDelegate {
        let handler: NIOLoopBound<KeepaliveHandler>

        func streamCreated(_ id: HTTP2StreamID, channel: any Channel) { handler.value.streamOpened() }
        func streamClosed(_ id: HTTP2StreamID, channel: any Channel) { handler.value.streamClosed() }
    }

    public func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        lastRead = context.eventLoop.now
        heard()
        context.fireChannelRead(data)
    }

    private func heard() {
        guard reportedSilent else { return }
        reportedSilent = false
        onSilence?(false)
    }

    /// Every socket read burst ends in a read-complete that passes through here, whether its frames were for the root
    /// stream (seen in `channelRead`) or for circuits (which go to the stream channels, not to this handler).
    public func channelReadComplete(context: ChannelHandlerContext) {
        lastRead = context.eventLoop.now
        heard()
        context.fireChannelReadComplete()
    }

    public func triggerUserOutboundEvent(context: ChannelHandlerContext, event: Any, promise: EventLoopPromise<Void>?) {
        if event is FabricKeepalive.StreamsEnded {
            if !context.channel.isActive {
                promise?.fail(ChannelError.ioOnClosedChannel)
            } else if openStreams == 0 || !countsStreams {
                promise?.succeed()
            } else {
                streamsEndedWaiters.append(promise ?? context.eventLoop.makePromise())
            }
            return
        }
        guard let probe = event as? FabricKeepalive.Probe else {
            context.triggerUserOutboundEvent(event, promise: promise)
            return
        }
        promise?.succeed()
        // A probe comes with a circuit about to be asked for: the idle close starts over.
        if openStreams == 0, idleTimer != nil { armIdleClose(context: context) }
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
            guard pings else { return }  // re-armed when a stream opens
            if now - lastRead >= configuration.interval {
                sendPing(context: context)
                if let onSilence, !reportedSilent {
                    reportedSilent = true
                    onSilence(true)
                }
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
    public struct Close: Sendable {
        public init() {}
    }

    public init() {}

    public func triggerUserOutboundEvent(context: ChannelHandlerContext, event: Any, promise: EventLoopPromise<Void>?) {
        guard event is Close else {
            context.triggerUserOutboundEvent(event, promise: promise)
            return
        }
        context.close(promise: promise)
    }
}
