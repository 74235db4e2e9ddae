import ILSCore
public import ILSCrypto
public import NIOCore

/// The gateway end of a circuit: answers the handshake as responder, applies the gateway's own access decision
/// before answering, and only after the device's signature is proven hands the decrypted stream to what
/// `onEstablished` installs (the proxy core). Not a byte reaches the backend before that.
public final class E2EResponderHandler: ChannelDuplexHandler, RemovableChannelHandler {
    public typealias InboundIn = ByteBuffer
    public typealias InboundOut = ByteBuffer
    public typealias OutboundIn = ByteBuffer
    public typealias OutboundOut = ByteBuffer

    /// Decides whether this verified-certificate holder may use this service (policy, revocation).
    public typealias Authorize = @Sendable (IdentityCertificate, String) -> AccessDecision
    /// Installs the handlers that consume the plaintext, after this one. Runs on the channel's event loop.
    public typealias OnEstablished = @Sendable (any Channel, E2EEstablishedEvent) throws -> Void

    private enum State {
        case awaitingHello(E2EResponder)
        case awaitingFinished(E2EResponder)
        case established(E2ERecordLayer)
        case failed
    }

    /// How long a device may take to complete the handshake. The relay is not trusted to end a circuit that stalls
    /// mid-handshake, so the gateway bounds it itself.
    public static let handshakeTimeout: TimeAmount = .seconds(10)

    private var state: State
    private let handshakeTimeout: TimeAmount
    private var handshakeTimer: Scheduled<Void>?
    private let authorize: Authorize
    private let onEstablished: OnEstablished
    private var batch = RecordBatch()

    /// `versions` is every handshake version this gateway answers (a gateway passes all of them; see
    /// `E2EResponder`).
    public init(
        credentials: E2EHandshake.Credentials,
        versions: [any E2EHandshakeVersion] = [E2EHandshake.version],
        authorize: @escaping Authorize,
        onEstablished: @escaping OnEstablished,
        handshakeTimeout: TimeAmount = E2EResponderHandler.handshakeTimeout
    ) {
        self.state = .awaitingHello(E2EResponder(credentials: credentials, versions: versions))
        self.handshakeTimeout = handshakeTimeout
        self.authorize = authorize
        self.onEstablished = onEstablished
    }

    public func handlerAdded(context: ChannelHandlerContext) {
        let channel = context.channel
        handshakeTimer = context.eventLoop.assumeIsolated().scheduleTask(in: handshakeTimeout) {
            if case .established = self.state { return }
            channel.close(promise: nil)
        }
    }

    public func handlerRemoved(context: ChannelHandlerContext) {
        handshakeTimer?.cancel()
        batch.fail(ChannelError.ioOnClosedChannel)
    }

    public func channelInactive(context: ChannelHandlerContext) {
        handshakeTimer?.cancel()
        batch.fail(ChannelError.ioOnClosedChannel)
        context.fireChannelInactive()
    }

    /// Before the circuit is established nothing above this handler can act on an error (a frame decoder refusing
    /// an oversized frame, a transport failure): the circuit is closed here. After, the proxy core handles it.
    public func errorCaught(context: ChannelHandlerContext, error: any Error) {
        if case .established = state {
            context.fireErrorCaught(error)
            return
        }
        state = .failed
        context.close(promise: nil)
    }

    public func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        let frame = unwrapInboundIn(data)
        do {
            switch state {
            case .awaitingHello(let responder):
                let (serverHello, service, peer) = try responder.receiveClientHello(Array(frame.readableBytesView))
                if case .deny(let reason) = authorize(peer, service) {
                    state = .failed
                    let channel = context.channel
                    let refusal = E2ERecordLayer.frame(
                        E2EHandshake.refusal(reason),
                        allocator: context.channel.allocator
                    )
                    context.writeAndFlush(wrapOutboundOut(refusal))
                        .whenComplete { _ in channel.close(promise: nil) }
                    return
                }
                state = .awaitingFinished(responder)
                context.writeAndFlush(
                    wrapOutboundOut(E2ERecordLayer.frame(serverHello, allocator: context.channel.allocator)),
                    promise: nil
                )
            case .awaitingFinished(let responder):
                let session = try responder.receiveClientFinished(Array(frame.readableBytesView))
                state = .established(E2ERecordLayer(session: session))
                handshakeTimer?.cancel()
                handshakeTimer = nil
                let event = E2EEstablishedEvent(
                    peer: PeerIdentity(id: session.peer.id, name: session.peer.name),
                    service: session.service
                )
                try onEstablished(context.channel, event)
                context.fireUserInboundEventTriggered(event)
            case .established(let layer):
                let (plaintext, final) = try layer.open(frame, allocator: context.channel.allocator)
                if plaintext.readableBytes > 0 { context.fireChannelRead(wrapInboundOut(plaintext)) }
                if final { context.fireUserInboundEventTriggered(ChannelEvent.inputClosed) }
            case .failed:
                break
            }
        } catch {
            state = .failed
            context.fireErrorCaught(error)
            context.close(promise: nil)
        }
    }

    /// Writes wait in `batch` for the flush, which seals them as one record (see `RecordBatch`).
    public func write(context: ChannelHandlerContext, data: NIOAny, promise: EventLoopPromise<Void>?) {
        guard case .established(let layer) = state else {
            promise?.fail(ChannelError.ioOnClosedChannel)
            return
        }
        let (waiting, alone) = batch.add(unwrapOutboundIn(data), promise: promise, allocator: context.channel.allocator)
        if let waiting { layer.write(waiting.plaintext, promise: waiting.promise, to: context) }
        if let alone { layer.write(alone.plaintext, promise: alone.promise, to: context) }
    }

    public func flush(context: ChannelHandlerContext) {
        if case .established(let layer) = state {
            if let (plaintext, promise) = batch.drain() {
                layer.write(plaintext, promise: promise, to: context)
            }
        }
        context.flush()
    }

    /// Only a half-close (`mode: .output`) is a clean end and sends the FINAL record; a full close is abortive, so
    /// the device learns that whatever it was receiving was cut short.
    public func close(context: ChannelHandlerContext, mode: CloseMode, promise: EventLoopPromise<Void>?) {
        if mode == .output, case .established(let layer) = state {
            // The FINAL record tells the device the response ended here, not that the circuit was cut.
            if let (plaintext, promise) = batch.drain() {
                layer.write(plaintext, promise: promise, to: context)
            }
            layer.write(ByteBuffer(), final: true, promise: nil, to: context)
            context.flush()
            state = .failed
        } else {
            batch.fail(ChannelError.ioOnClosedChannel)
        }
        context.close(mode: mode, promise: promise)
    }
}
