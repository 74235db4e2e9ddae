public import ILSCrypto
import NIOConcurrencyHelpers
public import NIOCore

/// A gateway's resumable circuits, by circuit id, from the end of their handshake to their close: a resumption
/// looks its circuit up here (`acceptResumption`). Attached and held alike: a device whose network went silent
/// resumes before the gateway has noticed that its old path is dead.
public final class ResumableCircuits: Sendable {
    private let circuits = NIOLockedValueBox<[[UInt8]: CircuitChannel]>([:])
    private let resumedTotal = NIOLockedValueBox(0)

    private let expiredTotal = NIOLockedValueBox(0)
    private let closedTotal = NIOLockedValueBox(0)

    /// Registered circuits that have closed so far (the gateway hands freed memory back to the system when it grows).
    public var closed: Int { closedTotal.withLockedValue { $0 } }

    /// Resumptions accepted so far.
    public var resumed: Int { resumedTotal.withLockedValue { $0 } }
    /// Held circuits whose grace window ran out (their backend requests were cancelled).
    public var expired: Int { expiredTotal.withLockedValue { $0 } }
    /// Called when a held circuit's grace window runs out (metrics, log).
    public let onExpired: @Sendable () -> Void
    /// Called with the identity id when a resumption was accepted (metrics, log).
    public let onResumed: @Sendable (String) -> Void

    public init(
        onExpired: @escaping @Sendable () -> Void = {},
        onResumed: @escaping @Sendable (String) -> Void = { _ in }
    ) {
        self.onExpired = onExpired
        self.onResumed = onResumed
    }

    /// How many circuits are registered, and how many of them are held (no path).
    public var counts: (registered: Int, held: Int) {
        let all = circuits.withLockedValue { Array($0.values) }
        return (all.count, all.filter { $0.heldFlag }.count)
    }

    /// Ends every registered circuit (the gateway stops) with `close`: by default a plain close, which the gateway
    /// makes an abortive one (`CircuitCloseHandler.abort`) so that no circuit half-closes and lingers on while held.
    /// Returns when each has closed.
    @discardableResult
    public func closeAll(_ close: (CircuitChannel) -> Void = { $0.close(promise: nil) }) -> [EventLoopFuture<Void>] {
        circuits.withLockedValue({ Array($0.values) }).map { circuit in
            close(circuit)
            return circuit.closeFuture
        }
    }

    func add(_ circuit: CircuitChannel, id: [UInt8]) {
        circuits.withLockedValue { $0[id] = circuit }
        circuit.onGraceExpired.append { [weak self] _ in
            self?.expiredTotal.withLockedValue { $0 += 1 }
            self?.onExpired()
        }
        circuit.onClosed.append { [weak self] _ in
            _ = self?.circuits.withLockedValue { $0.removeValue(forKey: id) }
            self?.closedTotal.withLockedValue { $0 += 1 }
        }
    }

    func circuit(id: [UInt8]) -> CircuitChannel? {
        circuits.withLockedValue { $0[id] }
    }

    /// The gateway's half of a resumption, installed on a stream that arrived with `FabricProtocol.resumeHeader`
    /// (after `StreamDataCodec` and the frame decoder): its first frame must be a RESUME for a circuit registered
    /// here, made with the circuit's key, by the identity the relay says (`deviceID`), with an attempt above the last
    /// accepted. `authorize` says whether that identity may still use the circuit (revoked, disabled, its grant taken
    /// away: a reason). Anything else is refused with the refusal frame and the stream closes; nothing of the circuit
    /// is sent or changed. Bounded in time: a stream that sends no RESUME within `timeout` is closed.
    public func acceptResumption(
        on pipeline: ChannelPipeline.SynchronousOperations,
        deviceID: String?,
        timeout: TimeAmount = E2EResponderHandler.handshakeTimeout,
        authorize: @escaping (_ identityID: String) -> String?
    ) throws {
        let path = CircuitPathHandler()
        try pipeline.addHandler(path)
        let stream = path.channel
        let timer = stream?.eventLoop.assumeIsolated().scheduleTask(in: timeout) {
            if path.circuit == nil { stream?.close(promise: nil) }
        }
        stream?.closeFuture.whenComplete { _ in timer?.cancel() }
        path.onFirstFrame = { [self] path, frame in
            timer?.cancel()
            if let reason = resume(path, frame: frame, deviceID: deviceID, authorize: authorize) {
                path.refuse(reason)
            }
        }
    }

    private func resume(
        _ path: CircuitPathHandler,
        frame: ByteBuffer,
        deviceID: String?,
        authorize: (String) -> String?
    ) -> String? {
        guard let message = try? E2EResumeMessage.parse(Array(frame.readableBytesView)), message.kind == .request
        else { return "the first message on a resumed circuit must be RESUME" }
        // The circuit's state is its event loop's: a circuit on another loop than this stream is not touched.
        guard let circuit = circuit(id: message.circuitID), circuit.eventLoop === path.channel?.eventLoop,
            let secrets = circuit.secrets, message.verify(with: secrets)
        else { return "this gateway holds no such circuit" }
        guard let peerID = circuit.peerID, peerID == deviceID else {
            return "the circuit belongs to another identity"
        }
        if let reason = authorize(peerID) { return reason }
        let answer = E2EResumeMessage(
            kind: .answer,
            circuitID: message.circuitID,
            attempt: message.attempt,
            received: circuit.received
        ).sealed(with: secrets)
        let refusal = circuit.resume(
            on: path,
            attempt: message.attempt,
            peerReceived: message.received,
            answer: E2ERecordLayer.frame(answer, allocator: circuit.allocator)
        )
        if refusal == nil {
            resumedTotal.withLockedValue { $0 += 1 }
            onResumed(peerID)
        }
        return refusal
    }
}

extension CircuitChannel {
    /// Registers a resumable circuit in `registry` once its handshake is done (an other suite's is not).
    public func register(in registry: ResumableCircuits) {
        onEstablished.append { circuit in
            if let id = circuit.secrets?.circuitID { registry.add(circuit, id: id) }
        }
    }

    /// The device's half of a resumption, on a new stream the relay opened to the circuit's gateway (after
    /// `StreamDataCodec` and the frame decoder): sends RESUME for `attempt` and attaches the stream once the
    /// gateway's RESUMED for it is proven. `done` gets nil then, or why the gateway refused (`refused`: the
    /// gateway's own refusal, which no retry changes) or the stream failed.
    package func sendResumption(
        on pipeline: ChannelPipeline.SynchronousOperations,
        attempt: UInt32,
        done: @escaping (_ failure: (reason: String, refused: Bool)?) -> Void
    ) throws {
        guard let secrets else { throw ChannelError.operationUnsupported }
        let path = CircuitPathHandler()
        try pipeline.addHandler(path)
        var answered = false
        path.onFirstFrame = { [self] path, frame in
            answered = true
            let bytes = Array(frame.readableBytesView)
            if let reason = E2EHandshake.refusalReason(bytes) {
                path.close(mode: .all, promise: nil)
                done((reason, true))
                return
            }
            guard let message = try? E2EResumeMessage.parse(bytes), message.kind == .answer,
                message.circuitID == secrets.circuitID, message.attempt == attempt, message.verify(with: secrets)
            else {
                path.close(mode: .all, promise: nil)
                done(("the gateway's answer to the resumption is not valid", true))
                return
            }
            guard resumed(on: path, peerReceived: message.received) else {
                path.close(mode: .all, promise: nil)
                done(("the gateway's answer names records this end never sent", true))
                return
            }
            done(nil)
        }
        path.channel?.closeFuture.whenComplete { _ in
            if !answered { done(("the path closed before the gateway answered", false)) }
        }
        let request = E2EResumeMessage(
            kind: .request,
            circuitID: secrets.circuitID,
            attempt: attempt,
            received: received
        ).sealed(with: secrets)
        path.write(E2ERecordLayer.frame(request, allocator: allocator), promise: nil)
        path.flush()
    }
}
