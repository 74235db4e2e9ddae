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

    /// What END_STREAM without the device's FINAL record does, asked of the layer above when it happens.
    public enum UnsealedEnd: Sendable {
        /// An end of the device's input that is not known to be clean: passed up as `inputClosed`, so a framed
        /// protocol above decides. HTTP's own framing says whether the request that arrived is whole: a whole one
        /// is answered, one cut mid-body is refused and its backend request aborted.
        case endOfInput
        /// A cut: `E2ECircuitError.truncated` goes up and the circuit closes (raw bytes, whose end nothing else
        /// can vouch for).
        case cut
    }

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
    private let unsealedEnd: @Sendable (any Channel) -> UnsealedEnd
    private let onCancelled: @Sendable () -> Void
    private var batch = RecordBatch()
    private var end = CircuitEnd()
    private var inbound = InboundRecords()
    /// The FINAL record has been sent: the gateway's direction is over.
    private var outputClosed = false

    /// `versions` is every handshake version this gateway answers (a gateway passes all of them; see
    /// `E2EResponder`); `suites` the record suites it agrees (a gateway that holds no circuit leaves the resumable
    /// one out).
    public init(
        credentials: E2EHandshake.Credentials,
        versions: [any E2EHandshakeVersion] = [E2EHandshake.version],
        suites: Set<E2ESuite> = Set(E2ESuite.allCases),
        authorize: @escaping Authorize,
        onEstablished: @escaping OnEstablished,
        handshakeTimeout: TimeAmount = E2EResponderHandler.handshakeTimeout,
        unsealedEnd: @escaping @Sendable (any Channel) -> UnsealedEnd = { _ in .cut },
        onCancelled: @escaping @Sendable () -> Void = {}
    ) {
        self.unsealedEnd = unsealedEnd
        self.onCancelled = onCancelled
        self.state = .awaitingHello(E2EResponder(credentials: credentials, versions: versions, suites: suites))
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
        inbound.stop()
        batch.fail(ChannelError.ioOnClosedChannel)
    }

    public func channelInactive(context: ChannelHandlerContext) {
        handshakeTimer?.cancel()
        inbound.stop()
        let waiting = inbound.drainAll()
        for item in waiting { deliver(item, context: context) }
        if !waiting.isEmpty { context.fireChannelReadComplete() }
        batch.fail(ChannelError.ioOnClosedChannel)
        if case .established = state, end.reportTruncation() {
            context.fireErrorCaught(E2ECircuitError.truncated)
        }
        context.fireChannelInactive()
    }

    /// Before the circuit is established nothing above this handler can act on an error (a frame decoder refusing
    /// an oversized frame, a transport failure): the circuit is closed here. After, the proxy core handles it; a
    /// reset of the stream that the gateway did not ask for reaches it as `E2ECircuitError.truncated`.
    public func errorCaught(context: ChannelHandlerContext, error: any Error) {
        // A circuit whose resumption failed says so once (`notResumed`); its close that follows is no cut to report.
        if let failed = error as? E2ECircuitError, failed.code == E2ECircuitError.notResumed.code { end.closing() }
        if case .established = state {
            if CircuitEnd.isCut(error) {
                if end.reportTruncation() { context.fireErrorCaught(E2ECircuitError.truncated) }
                return
            }
            context.fireErrorCaught(error)
            return
        }
        state = .failed
        context.close(promise: nil)
    }

    /// END_STREAM from below ends the device's direction. After its FINAL record that is the expected end
    /// (`inputClosed` has gone up already). Without it, the layer above says what it is (`unsealedEnd`): for the
    /// gateway's HTTP exchanges an end of input whose cleanliness HTTP's framing decides (a whole request is
    /// answered, deterministically, whatever the timing), for raw bytes a cut: the proxy core is told with
    /// `E2ECircuitError.truncated` and the circuit closes, so what reached the backend is aborted, never completed
    /// by an end of input that looks clean.
    public func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        guard case ChannelEvent.inputClosed = event, case .established = state else {
            context.fireUserInboundEventTriggered(event)
            return
        }
        if let item = inbound.unsealedEnd() { deliver(item, context: context) }
    }

    /// Hands one opened record (or the unsealed end) to the layer above.
    private func deliver(_ item: InboundRecords.Item, context: ChannelHandlerContext) {
        switch item {
        case .record(let plaintext, let final):
            if plaintext.readableBytes > 0 { context.fireChannelRead(wrapInboundOut(plaintext)) }
            if final { context.fireUserInboundEventTriggered(ChannelEvent.inputClosed) }
        case .unsealedEnd:
            deliverUnsealedEnd(context: context)
        case .cancelled:
            break
        }
    }

    /// A peer that sends further ahead of its ACKs than any end may keep (`InboundRecords.limit`).
    static let overflow = ILSError(
        .e2eWindowExceeded,
        "the device sent more than a circuit may carry unacknowledged; the circuit is closed"
    )

    public func read(context: ChannelHandlerContext) {
        let items = inbound.readRequested()
        guard !items.isEmpty else {
            context.read()
            return
        }
        for item in items { deliver(item, context: context) }
        channelReadComplete(context: context)
    }

    public func channelReadComplete(context: ChannelHandlerContext) {
        inbound.readCompleted()
        context.fireChannelReadComplete()
        acknowledge(context: context)
    }

    /// ACKs go on after our FINAL: the device's direction may still be sending (`CircuitPathMachine.pathEndDue`).
    private func acknowledge(context: ChannelHandlerContext) {
        guard case .established(let layer) = state else { return }
        let due = inbound.ackDue(resumable: layer.isResumable, on: context.eventLoop) { [weak self] in
            guard let self, case .established(let layer) = self.state, context.channel.isActive,
                let count = self.inbound.acknowledgeNow()
            else { return }
            layer.writeAck(count, to: context)
        }
        if let due { layer.writeAck(due, to: context) }
    }

    private func deliverUnsealedEnd(context: ChannelHandlerContext) {
        if end.reportTruncation() {
            if unsealedEnd(context.channel) == .endOfInput {
                context.fireUserInboundEventTriggered(ChannelEvent.inputClosed)
                return
            }
            context.fireErrorCaught(E2ECircuitError.truncated)
            end.closing()
            batch.fail(ChannelError.ioOnClosedChannel)
            context.close(promise: nil)
        }
    }

    public func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        let frame = unwrapInboundIn(data)
        do {
            switch state {
            case .awaitingHello(let responder):
                let answer: (serverHello: [UInt8], service: String, peer: IdentityCertificate)
                do {
                    answer = try responder.receiveClientHello(Array(frame.readableBytesView))
                } catch {
                    // A hello this gateway cannot answer (a version it does not speak, no suite in common, a
                    // certificate it does not accept) gets the refusal frame with the reason, not a bare reset:
                    // the device can then tell its user why.
                    refuse(context, reason: Self.reason(error))
                    return
                }
                let (serverHello, service, peer) = answer
                if case .deny(let reason) = authorize(peer, service) {
                    refuse(context, reason: reason)
                    return
                }
                state = .awaitingFinished(responder)
                context.writeAndFlush(
                    wrapOutboundOut(E2ERecordLayer.frame(serverHello, allocator: context.channel.allocator)),
                    promise: nil
                )
            case .awaitingFinished(let responder):
                let session = try responder.receiveClientFinished(Array(frame.readableBytesView))
                let layer = E2ERecordLayer(session: session)
                state = .established(layer)
                context.triggerUserOutboundEvent(layer.establishedEvent, promise: nil)
                inbound.established(layer: layer, channel: context.channel)
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
                if let count = layer.acknowledged {
                    inbound.openedAck()
                    context.triggerUserOutboundEvent(CircuitRecordsEvent.acknowledged(count), promise: nil)
                    return
                }
                if final, layer.peerCancelled {
                    context.triggerUserOutboundEvent(CircuitRecordsEvent.peerFinished, promise: nil)
                    // The device gave up, and said so under the circuit's key: the backend's work stops now. The
                    // reset that follows is its own doing, not a cut to report.
                    end.closing()
                    onCancelled()
                    context.fireErrorCaught(E2ECircuitError.cancelled)
                    batch.fail(ChannelError.ioOnClosedChannel)
                    context.close(promise: nil)
                    return
                }
                if final { end.finalReceived() }
                let item = inbound.opened(plaintext, final: final)
                if final { layer.peerFinished(acknowledging: &inbound, to: context) }
                if let item { deliver(item, context: context) }
                if inbound.overflowed { throw Self.overflow }
            case .failed:
                break
            }
        } catch {
            // A cut of this end's own (the device sent more than it may unacknowledged, or a record that does not
            // open): with a resumable suite the device is told under the circuit's key, or it would take the reset
            // for a lost path and try to resume a circuit this gateway no longer holds (`not_resumed`).
            if case .established(let layer) = state, layer.isResumable, !outputClosed {
                outputClosed = true
                batch.fail(ChannelError.ioOnClosedChannel)
                layer.writeCancel(to: context, promise: nil)
                context.flush()
            }
            end.closing()
            state = .failed
            context.fireErrorCaught(error)
            context.close(promise: nil)
        }
    }

    /// The sentence of a handshake failure, safe to send: it names what was wrong with the device's own message.
    private static func reason(_ error: any Error) -> String {
        (error as? ILSError)?.reason ?? "end-to-end handshake failed"
    }

    /// Answers the ClientHello with the refusal frame (`0x7F`, the reason) and closes the circuit once it is out.
    private func refuse(_ context: ChannelHandlerContext, reason: String) {
        state = .failed
        let channel = context.channel
        let refusal = E2ERecordLayer.frame(E2EHandshake.refusal(reason), allocator: context.channel.allocator)
        context.writeAndFlush(wrapOutboundOut(refusal)).whenComplete { _ in channel.close(promise: nil) }
    }

    /// Writes wait in `batch` for the flush, which seals them as one record (see `RecordBatch`).
    public func write(context: ChannelHandlerContext, data: NIOAny, promise: EventLoopPromise<Void>?) {
        guard case .established(let layer) = state, !outputClosed else {
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
                // An ACK that waits for data goes in the same flush, just before it.
                if let owed = inbound.takeOwed() { layer.writeAck(owed, to: context, flush: false) }
                layer.write(plaintext, promise: promise, to: context)
            }
        }
        context.flush()
    }

    /// A half-close (`mode: .output`) is a clean end: the FINAL record, then END_STREAM. A full close after the
    /// device's FINAL record (the exchange is over both ways) is clean too: FINAL and END_STREAM, and the stream
    /// closes once both directions have ended. Any other full close is abortive (RST_STREAM), so the device learns
    /// that whatever it was receiving was cut short. (`CircuitCloseHandler` in the gateway turns the proxy core's
    /// close between two HTTP exchanges into a half-close.)
    public func close(context: ChannelHandlerContext, mode: CloseMode, promise: EventLoopPromise<Void>?) {
        guard case .established(let layer) = state, !outputClosed, mode == .output || end.peerFinished else {
            if mode == .all { end.closing() }
            batch.fail(ChannelError.ioOnClosedChannel)
            // Cutting an answer short on purpose (the backend failed mid-response): with a resumable suite the device
            // is told under the circuit's key, or it would take the reset for a lost path and try to resume.
            if mode == .all, !outputClosed, case .established(let layer) = state, layer.isResumable {
                outputClosed = true
                layer.writeCancel(to: context, promise: nil)
                context.flush()
            }
            context.close(mode: mode, promise: promise)
            return
        }
        // The FINAL record tells the device the response ended here, not that the circuit was cut.
        outputClosed = true
        if let (plaintext, promise) = batch.drain() {
            layer.write(plaintext, promise: promise, to: context)
        }
        layer.write(ByteBuffer(), final: true, promise: nil, to: context)
        context.flush()
        if mode == .output {
            context.close(mode: .output, promise: promise)
            return
        }
        let channel = context.channel
        let ended = context.eventLoop.makePromise(of: Void.self)
        context.close(mode: .output, promise: ended)
        ended.futureResult.whenComplete { _ in
            // Both directions have ended by now (the peer's FINAL came first) and the stream closes by itself; a
            // close here only cleans up should the peer's END_STREAM be late.
            channel.close(promise: nil)
            promise?.succeed()
        }
    }
}
