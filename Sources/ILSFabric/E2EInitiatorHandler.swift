import ILSCore
public import ILSCrypto
public import NIOCore

/// The device end of a circuit: runs the handshake as initiator, then encrypts what the app writes and decrypts
/// what the gateway sends. Writes made before the handshake completes are held (in order) and sent after it.
///
/// Sits above a `FrameDecoder` on whatever carries the circuit, and writes framed messages itself (a record is sealed
/// straight into its framed wire buffer).
public final class E2EInitiatorHandler: ChannelDuplexHandler, RemovableChannelHandler {
    public typealias InboundIn = ByteBuffer
    public typealias InboundOut = ByteBuffer
    public typealias OutboundIn = ByteBuffer
    public typealias OutboundOut = ByteBuffer

    private enum State {
        case idle(E2EInitiator)
        case awaitingServerHello(E2EInitiator)
        case established(E2ERecordLayer)
        case failed
    }

    /// The gateway refused the circuit, with its reason.
    public struct Refused: Error, Sendable {
        public let reason: String
    }

    private var state: State
    private var pending = PendingWrites()
    private var batch = RecordBatch()
    /// The app's side of the circuit. A half-close before the handshake completed (the tunnel reads a client's
    /// request and its end of file together, while the handshake's round trip is still out) waits for it, with its
    /// promise: the FINAL record goes once the handshake is done, after the writes held before it. Writes after a
    /// half-close fail, as on a socket.
    private enum Output {
        case open
        case halfCloseRequested(EventLoopPromise<Void>?)
        case closed

        var isOpen: Bool {
            if case .open = self { true } else { false }
        }
    }
    private var output = Output.open
    private var end = CircuitEnd()
    private var inbound = InboundRecords()
    private let service: String

    /// `version` is the handshake this device speaks: the current one unless a test plays an older device. `suites`
    /// are the record suites it offers, most preferred first (by default all that `version` has).
    public init(
        credentials: E2EHandshake.Credentials,
        service: String,
        version: any E2EHandshakeVersion = E2EHandshake.version,
        suites: [E2ESuite]? = nil
    ) {
        self.service = service
        self.state = .idle(
            E2EInitiator(credentials: credentials, service: service, version: version, suites: suites)
        )
    }

    public func handlerAdded(context: ChannelHandlerContext) {
        if context.channel.isActive { start(context) }
    }

    public func channelActive(context: ChannelHandlerContext) {
        start(context)
        context.fireChannelActive()
    }

    private func start(_ context: ChannelHandlerContext) {
        guard case .idle(let initiator) = state else { return }
        state = .awaitingServerHello(initiator)
        context.writeAndFlush(
            wrapOutboundOut(E2ERecordLayer.frame(initiator.clientHello(), allocator: context.channel.allocator)),
            promise: nil
        )
    }

    public func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        let frame = unwrapInboundIn(data)
        switch state {
        case .awaitingServerHello(let initiator):
            let message = Array(frame.readableBytesView)
            if let reason = E2EHandshake.refusalReason(message) {
                fail(context, Refused(reason: reason))
                return
            }
            do {
                let (finished, session) = try initiator.receiveServerHello(message)
                let layer = E2ERecordLayer(session: session)
                state = .established(layer)
                context.write(
                    wrapOutboundOut(E2ERecordLayer.frame(finished, allocator: context.channel.allocator)),
                    promise: nil
                )
                // Every frame after ClientFinished is a record: the circuit under this handler counts from here.
                context.triggerUserOutboundEvent(layer.establishedEvent, promise: nil)
                inbound.established(layer: layer, channel: context.channel)
                for write in pending.drain() {
                    add(write.buffer, layer: layer, context: context, promise: write.promise)
                    if write.flushAfter, let (plaintext, promise) = batch.drain() {
                        layer.write(plaintext, promise: promise, to: context)
                    }
                }
                // Unflushed writes stay in the batch for the app's next flush, as they would on a ready circuit,
                // unless the app has half-closed meanwhile: then they go now, and the FINAL record after them.
                if case .halfCloseRequested(let promise) = output {
                    sendFinal(layer: layer, context: context, promise: promise)
                }
                context.flush()
                context.fireUserInboundEventTriggered(
                    E2EEstablishedEvent(
                        peer: PeerIdentity(id: session.peer.id, name: session.peer.name),
                        service: service
                    )
                )
            } catch {
                fail(context, error)
            }
        case .established(let layer):
            do {
                let (plaintext, final) = try layer.open(frame, allocator: context.channel.allocator)
                if let count = layer.acknowledged {
                    inbound.openedAck()
                    context.triggerUserOutboundEvent(CircuitRecordsEvent.acknowledged(count), promise: nil)
                    return
                }
                // Only a device cancels: a CANCEL from the gateway's side is no clean end.
                if final, layer.peerCancelled {
                    context.triggerUserOutboundEvent(CircuitRecordsEvent.peerFinished, promise: nil)
                    // The gateway cut the answer short (its backend failed): after what came before it, in order.
                    if let item = inbound.cancelled() { deliver(item, context: context) }
                    return
                }
                if final { end.finalReceived() }
                let item = inbound.opened(plaintext, final: final)
                if final { layer.peerFinished(acknowledging: &inbound, to: context) }
                if let item { deliver(item, context: context) }
                if inbound.overflowed { fail(context, E2EResponderHandler.overflow) }
            } catch {
                fail(context, error)
            }
        case .idle, .failed:
            break
        }
    }

    /// END_STREAM from below ends the gateway's direction. After its FINAL record that is the expected end (and
    /// `inputClosed` has gone up already); without it the direction was cut, and the app is told so instead of
    /// seeing an end of input that looks like a complete answer.
    public func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        guard case ChannelEvent.inputClosed = event, case .established = state else {
            context.fireUserInboundEventTriggered(event)
            return
        }
        if let item = inbound.unsealedEnd() { deliver(item, context: context) }
    }

    /// Hands one opened record (or the unsealed end: a cut) to the layer above.
    private func deliver(_ item: InboundRecords.Item, context: ChannelHandlerContext) {
        switch item {
        case .record(let plaintext, let final):
            if plaintext.readableBytes > 0 { context.fireChannelRead(wrapInboundOut(plaintext)) }
            if final { context.fireUserInboundEventTriggered(ChannelEvent.inputClosed) }
        case .unsealedEnd:
            guard end.reportTruncation() else { return }
            // What came before the cut goes out first (a glue flushes at read-complete; the cut resets its socket).
            context.fireChannelReadComplete()
            fail(context, E2ECircuitError.truncated)
        case .cancelled:
            context.fireChannelReadComplete()
            fail(context, E2ECircuitError.truncated)
        }
    }

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
        // ACKs go on after our FINAL: the gateway's direction may still be sending (`CircuitPathMachine.pathEndDue`).
        guard case .established(let layer) = state else { return }
        let due = inbound.ackDue(resumable: layer.isResumable, on: context.eventLoop) { [weak self] in
            guard let self, case .established(let layer) = self.state, context.channel.isActive,
                let count = self.inbound.acknowledgeNow()
            else { return }
            layer.writeAck(count, to: context)
        }
        if let due { layer.writeAck(due, to: context) }
    }

    /// A reset of the established circuit's stream that this side did not ask for is a truncation (reported once,
    /// in place of the HTTP/2 error); other errors go up unchanged.
    public func errorCaught(context: ChannelHandlerContext, error: any Error) {
        // A circuit whose resumption failed says so once (`notResumed`), as does one the controller ended for its
        // identity (`refused`: identity_blocked, dial_denied); the close that follows is no cut to report.
        if let failed = error as? E2ECircuitError,
            failed.code == E2ECircuitError.notResumed.code || E2ECircuitError.refusedCodes.contains(failed.code)
        {
            end.closing()
        }
        if case .established = state, CircuitEnd.isCut(error) {
            if end.reportTruncation() { context.fireErrorCaught(E2ECircuitError.truncated) }
            return
        }
        context.fireErrorCaught(error)
    }

    public func write(context: ChannelHandlerContext, data: NIOAny, promise: EventLoopPromise<Void>?) {
        let buffer = unwrapOutboundIn(data)
        switch state {
        case _ where !output.isOpen: promise?.fail(ChannelError.outputClosed)
        case .established(let layer): add(buffer, layer: layer, context: context, promise: promise)
        case .idle, .awaitingServerHello: pending.append(buffer, promise)
        case .failed: promise?.fail(ChannelError.ioOnClosedChannel)
        }
    }

    public func flush(context: ChannelHandlerContext) {
        if case .established(let layer) = state {
            if let (plaintext, promise) = batch.drain() {
                // An ACK that waits for data goes in the same flush, just before it.
                if let owed = inbound.takeOwed() { layer.writeAck(owed, to: context, flush: false) }
                layer.write(plaintext, promise: promise, to: context)
            }
            context.flush()
        } else {
            pending.requestFlush()
        }
    }

    /// A half-close from the app becomes the FINAL record, then END_STREAM, so the gateway can tell "done" from
    /// "cut". Before the handshake completes the half-close waits for it (see `Output`); passing it down would end
    /// the stream before the writes held for the handshake.
    ///
    /// A full close after the gateway's FINAL record (the answer is complete) is a clean end too: FINAL and
    /// END_STREAM, and the stream closes once both directions have ended. Any other full close is abortive
    /// (RST_STREAM): the gateway learns the device went away mid-exchange, and stops the backend's work.
    public func close(context: ChannelHandlerContext, mode: CloseMode, promise: EventLoopPromise<Void>?) {
        if mode == .all, end.peerFinished, output.isOpen, case .established(let layer) = state {
            let channel = context.channel
            let ended = context.eventLoop.makePromise(of: Void.self)
            sendFinal(layer: layer, context: context, promise: ended)
            ended.futureResult.whenComplete { _ in
                // Both directions have ended by now (the peer's FINAL came first) and the stream closes by itself; a
                // close here only cleans up should the peer's END_STREAM be late.
                channel.close(promise: nil)
                promise?.succeed()
            }
            return
        }
        if mode == .output {
            switch (state, output) {
            case (.failed, _):
                break
            case (_, .closed):
                promise?.succeed()
                return
            case (_, .halfCloseRequested(nil)):
                output = .halfCloseRequested(promise)
                return
            case (_, .halfCloseRequested(let held?)):
                if let promise { held.futureResult.cascade(to: promise) }
                return
            case (.established(let layer), .open):
                sendFinal(layer: layer, context: context, promise: promise)
                return
            case (.idle, .open), (.awaitingServerHello, .open):
                output = .halfCloseRequested(promise)
                return
            }
        }
        if mode == .all { end.closing() }
        let outputWasOpen = output.isOpen
        dropOutput(ChannelError.ioOnClosedChannel)
        // Giving up on a circuit whose answer has not ended: with suite 4 the gateway is told so, sealed (CANCEL), so
        // it can tell a cancel from a path that was lost; the stream is then reset as before. (What waited for a
        // flush was never sealed, so the CANCEL follows the last record sent.)
        if mode == .all, outputWasOpen, case .established(let layer) = state, layer.hasCancel {
            output = .closed
            layer.writeCancel(to: context, promise: nil)
            context.flush()
        }
        context.close(mode: mode, promise: promise)
    }

    /// What waits in the batch, then the FINAL record, flushed, then END_STREAM (the half-close passed down).
    private func sendFinal(layer: E2ERecordLayer, context: ChannelHandlerContext, promise: EventLoopPromise<Void>?) {
        output = .closed
        if let (plaintext, promise) = batch.drain() {
            layer.write(plaintext, promise: promise, to: context)
        }
        layer.write(ByteBuffer(), final: true, promise: nil, to: context)
        context.flush()
        context.close(mode: .output, promise: promise)
    }

    /// Fails what waits for a flush, the writes held for the handshake and a half-close waiting for it: the circuit
    /// is going away. (A writer waits on a held write's promise while the circuit is not writable, as it is until
    /// the handshake is done: a circuit that closes mid-handshake must not leave it waiting for good.)
    private func dropOutput(_ error: any Error) {
        batch.fail(error)
        pending.fail(error)
        if case .halfCloseRequested(let promise) = output {
            output = .closed
            promise?.fail(error)
        }
    }

    public func handlerRemoved(context: ChannelHandlerContext) {
        inbound.stop()
        dropOutput(ChannelError.ioOnClosedChannel)
    }

    public func channelInactive(context: ChannelHandlerContext) {
        inbound.stop()
        let waiting = inbound.drainAll()
        for item in waiting { deliver(item, context: context) }
        if !waiting.isEmpty { context.fireChannelReadComplete() }
        if case .established = state, end.reportTruncation() {
            context.fireErrorCaught(E2ECircuitError.truncated)
        }
        dropOutput(ChannelError.ioOnClosedChannel)
        context.fireChannelInactive()
    }

    /// Writes wait in `batch` for the flush, which seals them as one record (see `RecordBatch`).
    private func add(
        _ buffer: ByteBuffer,
        layer: E2ERecordLayer,
        context: ChannelHandlerContext,
        promise: EventLoopPromise<Void>?
    ) {
        let (waiting, alone) = batch.add(buffer, promise: promise, allocator: context.channel.allocator)
        if let waiting { layer.write(waiting.plaintext, promise: waiting.promise, to: context) }
        if let alone { layer.write(alone.plaintext, promise: alone.promise, to: context) }
    }

    private func fail(_ context: ChannelHandlerContext, _ error: any Error) {
        end.closing()
        let outputWasOpen = output.isOpen
        dropOutput(error)
        // Giving up on the circuit (the gateway sent more than it may, or a record that does not open): told under
        // the circuit's key, as a cancel is, so the gateway stops the backend now instead of holding it for a
        // resumption that will never come.
        if outputWasOpen, case .established(let layer) = state, layer.hasCancel {
            output = .closed
            layer.writeCancel(to: context, promise: nil)
            context.flush()
        }
        state = .failed
        pending.fail(error)
        context.fireErrorCaught(error)
        context.close(promise: nil)
    }
}
