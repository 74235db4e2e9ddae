import Dispatch
public import ILSCore
package import ILSCrypto
public import ILSFabric
import NIOConcurrencyHelpers
public import NIOCore
import NIOHTTP2
public import NIOPosix

/// Dials services through the overlay for an app or the tunnel: one mTLS HTTP/2 connection to the controller
/// (made on first use and again after it is lost), one stream per circuit, end-to-end encrypted to the gateway.
///
/// With several controller replicas in the identity file (`IdentityFile.controllerAddresses`), a connection attempt
/// that fails (refused, TLS, timeout) goes on to the next replica at once; the one that answered is used until its
/// connection fails, and the next connection tries it first.
///
/// `dial` returns a channel that carries the app's plaintext bytes: write `ByteBuffer`s, read `ByteBuffer`s.
public final class OverlayDialer: Sendable {
    /// Why a dial failed, for a person and for code.
    public enum DialError: Error, Sendable, Equatable {
        /// The controller could not be reached.
        case controllerUnreachable(String)
        /// The controller or the gateway refused the circuit (`code` is stable, e.g. `dial_denied`,
        /// `service_unavailable`).
        case refused(code: String, reason: String)
    }

    public let eventLoop: any EventLoop
    /// The identity in use; `replaceIdentity` swaps it after a renewal (new connections and circuits use it).
    private let current: NIOLockedValueBox<Identity>
    private let connectionBox = NIOLockedValueBox<EventLoopFuture<Connection>?>(nil)

    /// How the controller connection notices a silent network drop (after a Wi-Fi to cellular switch, say): it is
    /// then closed, and the next circuit opens a new one.
    public let keepalive: FabricKeepalive
    /// How long a circuit whose path is lost waits to be resumed, and what it may keep meanwhile.
    public let retention: CircuitRetention

    /// The end-to-end handshake this device speaks: the current version; tests play older devices with it.
    private let handshakeVersion: any E2EHandshakeVersion
    /// The record suites the device offers (nil: all of `handshakeVersion`'s). With a grace window of 0 the device
    /// cannot resume, so it does not offer the resumable suite: nothing is kept or acknowledged at either end, and
    /// the gateway ends the backend request with the path, as before resumption (docs/operations.md).
    private let offeredSuites: [E2ESuite]?

    public convenience init(
        identity: IdentityFile,
        eventLoop: any EventLoop = MultiThreadedEventLoopGroup.singleton.next(),
        keepalive: FabricKeepalive = .standard,
        retention: CircuitRetention = .standard
    ) throws(ILSError) {
        try self.init(
            identity: identity,
            eventLoop: eventLoop,
            keepalive: keepalive,
            handshakeVersion: E2EHandshake.version,
            retention: retention
        )
    }

    package init(
        identity: IdentityFile,
        eventLoop: any EventLoop,
        keepalive: FabricKeepalive,
        handshakeVersion: any E2EHandshakeVersion,
        retention: CircuitRetention = .standard,
        suites: [E2ESuite]? = nil
    ) throws(ILSError) {
        self.eventLoop = eventLoop
        self.keepalive = keepalive
        self.retention = retention
        self.handshakeVersion = handshakeVersion
        let unresumable = handshakeVersion.suites.filter { !$0.isResumable }
        self.offeredSuites = suites ?? (retention.grace > .zero || unresumable.isEmpty ? nil : unresumable)
        self.current = NIOLockedValueBox(try Self.load(identity))
    }

    /// The identity in use: a connector per controller replica, in the order they are tried, and which one to
    /// try first (the last that answered).
    private struct Identity {
        var file: IdentityFile
        var connectors: [FabricConnector]
        var credentials: E2EHandshake.Credentials
        var preferred = 0
    }

    private let learnedHandler = NIOLockedValueBox<(@Sendable (IdentityFile) -> Void)?>(nil)
    /// Where `onControllersLearned`'s handler runs: one serial queue per dialer.
    private let learning = DispatchQueue(label: "ils.overlay-dialer.learn")

    /// Calls `body` with the identity, its `controllers` replaced, whenever a circuit answer names a controller list
    /// that differs from the one in use (`ControllerAddress.listHeader`): a replica joined or left. The dialer uses
    /// the new list from the next connection on by itself; `body` keeps it (`OverlayClient(store:)` saves it in the
    /// identity store), so the next launch fails over too.
    public func onControllersLearned(_ body: @escaping @Sendable (IdentityFile) -> Void) {
        learnedHandler.withLockedValue { $0 = body }
    }

    /// A controller named the cluster's controllers: used from the next connection on (the one that answered stays
    /// first), and handed to `onControllersLearned`.
    private func heard(_ announced: [ControllerAddress]) {
        let learned = current.withLockedValue { current -> IdentityFile? in
            guard let file = current.file.learning(announced),
                var loaded = try? Self.load(file)
            else { return nil }
            let address = current.connectors[current.preferred].address
            loaded.preferred = loaded.connectors.firstIndex { $0.address == address } ?? 0
            current = loaded
            return file
        }
        guard let learned, let handler = learnedHandler.withLockedValue({ $0 }) else { return }
        // Off the connection's event loop (the handler writes a file or the Keychain), in the order the lists came.
        learning.async { handler(learned) }
    }

    private static func load(_ identity: IdentityFile) throws(ILSError) -> Identity {
        var connectors: [FabricConnector] = []
        for address in identity.controllerAddresses {
            connectors.append(try FabricConnector(identity: identity, alpn: FabricProtocol.dialALPN, address: address))
        }
        // An unparseable `controller` leaves the list empty: let the connector say why, as before replicas.
        if connectors.isEmpty { connectors = [try FabricConnector(identity: identity, alpn: FabricProtocol.dialALPN)] }
        return Identity(
            file: identity,
            connectors: connectors,
            credentials: try E2EHandshake.Credentials(
                certificatePEM: identity.certificate,
                privateKeyPEM: identity.privateKey,
                caCertificatePEM: identity.caCertificate
            )
        )
    }

    /// Uses a renewed identity from now on: the next circuit opens a new controller connection with it. The old
    /// connection is left to finish the circuits it carries (the controller stops accepting new ones on it).
    public func replaceIdentity(_ identity: IdentityFile) throws(ILSError) {
        var loaded = try Self.load(identity)
        current.withLockedValue { current in
            // The replica that answered last stays first, if the new file still lists it.
            let address = current.connectors[current.preferred].address
            loaded.preferred = loaded.connectors.firstIndex { $0.address == address } ?? 0
            current = loaded
        }
        connectionBox.withLockedValue { $0 = nil }
    }

    /// The controller replica the next connection tries first (for tests).
    public var preferredController: ControllerAddress {
        current.withLockedValue { $0.connectors[$0.preferred].address }
    }

    /// A controller connection: its channel (for keepalive probes) and its stream multiplexer.
    private struct Connection {
        let channel: any Channel
        let multiplexer: NIOHTTP2Handler.StreamMultiplexer
    }

    /// The live connection, connecting if there is none; `fresh` says whether it was made for this call.
    private func connection() -> (EventLoopFuture<Connection>, fresh: Bool) {
        connectionBox.withLockedValue { existing in
            if let existing { return (existing, false) }
            let promise = eventLoop.makePromise(of: Connection.self)
            let (connectors, first) = current.withLockedValue { ($0.connectors, $0.preferred) }
            existing = promise.futureResult
            connect(connectors: connectors, index: first, tries: connectors.count, errors: [], promise: promise)
            return (promise.futureResult, true)
        }
    }

    /// Connects through `connectors[index]`, and on failure through the next ones in turn (wrapping), `tries` in
    /// all; the first that connects becomes the preferred one. Fails with every replica's error when none does.
    private func connect(
        connectors: [FabricConnector],
        index: Int,
        tries: Int,
        errors: [String],
        promise: EventLoopPromise<Connection>
    ) {
        let box = self.connectionBox
        let keepalive = self.keepalive
        let connector = connectors[index]
        let mine = promise.futureResult
        connector.connect(on: eventLoop) { channel in
            let multiplexer = try channel.pipeline.syncOperations.configureFabricHTTP2(
                mode: .client,
                keepalive: KeepaliveHandler(keepalive)
            )
            try channel.pipeline.syncOperations.addHandler(FabricConnectionErrorHandler())
            promise.succeed(Connection(channel: channel, multiplexer: multiplexer))
            channel.closeFuture.whenComplete { _ in
                // Forget this connection only if it is still the current one (not after a renewal swapped it).
                box.withLockedValue { if $0 === mine { $0 = nil } }
            }
        }.whenComplete { result in
            switch result {
            case .success:
                self.current.withLockedValue { current in
                    if let found = current.connectors.firstIndex(where: { $0.address == connector.address }) {
                        current.preferred = found
                    }
                }
            case .failure(let error):
                let reason = "\(connector.address): \((error as? ILSError)?.reason ?? "\(error)")"
                guard tries > 1 else {
                    box.withLockedValue { if $0 === mine { $0 = nil } }
                    promise.fail(DialError.controllerUnreachable(Self.unreachable(errors + [reason])))
                    return
                }
                self.connect(
                    connectors: connectors,
                    index: (index + 1) % connectors.count,
                    tries: tries - 1,
                    errors: errors + [reason],
                    promise: promise
                )
            }
        }
    }

    /// The sentence for a dial that reached no controller, naming each one tried and why it failed.
    private static func unreachable(_ reasons: [String]) -> String {
        reasons.count == 1
            ? "cannot reach the controller at \(reasons[0])"
            : "cannot reach any controller (\(reasons.joined(separator: "; ")))"
    }

    /// Opens an end-to-end encrypted circuit to `service`.
    ///
    /// A connection that has been quiet is probed as the circuit is asked for (a PING alongside the request), so one
    /// that the network dropped without a word (a Wi-Fi to cellular switch, a NAT mapping gone) is found out within
    /// the keepalive timeout instead of at its next interval; a circuit whose connection dies before it was answered
    /// is then dialled once more on a new connection, so the app's request goes through instead of failing.
    public func dial(service: String) -> EventLoopFuture<any Channel> {
        let (connection, fresh) = connection()
        return dial(service: service, on: connection).flatMapError { error in
            guard !fresh, Self.connectionDied(error) else { return self.eventLoop.makeFailedFuture(error) }
            self.connectionBox.withLockedValue { if $0 === connection { $0 = nil } }
            return self.dial(service: service, on: self.connection().0)
        }
    }

    /// Whether a dial failed because its connection closed before the circuit was answered.
    /// Resumes a held circuit (its path was lost): a new stream through the controller the dialer reaches now,
    /// to the gateway that holds the circuit, RESUME, and once the gateway's RESUMED is proven the circuit goes on
    /// over it. A failure that another try may cure (no controller reachable, the gateway not linked yet, the stream
    /// lost before the answer) is tried again, waiting 100 ms doubling to 2 s, until the grace window ends; a refusal
    /// by the gateway or by policy ends the circuit with `E2ECircuitError.notResumed(because:)`.
    private func resume(_ circuit: CircuitChannel, service: String, backoff: TimeAmount) {
        let retry = { (reason: String) in
            let next = min(max(backoff * 2, .milliseconds(100)), .seconds(2))
            guard let until = circuit.heldUntil, NIODeadline.now() + next < until else {
                circuit.failResumption("no path to the gateway within the grace window (last: \(reason))")
                return
            }
            circuit.eventLoop.assumeIsolated().scheduleTask(in: next) {
                self.resume(circuit, service: service, backoff: next)
            }
        }
        guard circuit.isHeld else { return }
        guard let gateway = circuit.peerID, let attempt = circuit.nextAttempt() else {
            circuit.failResumption("the grace window ran out")
            return
        }
        openResumptionStream(service: service, gateway: gateway).hop(to: circuit.eventLoop).assumeIsolated()
            .whenComplete { result in
                switch result {
                case .success(let stream):
                    do {
                        try circuit.sendResumption(on: stream.pipeline.syncOperations, attempt: attempt) { failure in
                            guard let failure else { return }
                            if failure.refused {
                                circuit.failResumption(failure.reason)
                            } else {
                                retry(failure.reason)
                            }
                        }
                    } catch {
                        stream.close(promise: nil)
                        retry("\(error)")
                    }
                case .failure(let error):
                    if let refused = error as? CircuitRefused,
                        ["dial_denied", "identity_blocked", "unknown_service"].contains(refused.code)
                    {
                        circuit.failResumption(refused.reason)
                        return
                    }
                    retry((error as? CircuitRefused)?.reason ?? "\(error)")
                }
            }
    }

    /// A stream through the controller the dialer reaches now to `gateway`'s links for `service`, opened with
    /// `FabricProtocol.resumeHeader`, its frames decoded: what a resumption's RESUME goes on.
    package func openResumptionStream(service: String, gateway: String) -> EventLoopFuture<any Channel> {
        connection().0.flatMap { connection -> EventLoopFuture<any Channel> in
            let opened = self.eventLoop.makePromise(of: Void.self)
            let stream = connection.multiplexer.createStreamChannel { stream in
                stream.eventLoop.makeCompletedFuture {
                    try stream.pipeline.syncOperations.addHandler(
                        CircuitDialer(
                            service: service,
                            extraHeaders: [(FabricProtocol.resumeHeader, gateway)],
                            opened: opened
                        )
                    )
                }
            }
            stream.whenFailure { opened.fail($0) }
            return stream.and(opened.futureResult).flatMapThrowing { stream, _ in
                let pipeline = stream.pipeline.syncOperations
                try pipeline.addHandler(StreamDataCodec())
                try pipeline.addHandler(ByteToMessageHandler(FrameDecoder()))
                return stream
            }
        }
    }

    private static func connectionDied(_ error: any Error) -> Bool {
        if case DialError.refused(code: "closed", _) = error { return true }
        return error is ChannelError || error is NIOHTTP2Errors.StreamClosed
    }

    private func dial(service: String, on connection: EventLoopFuture<Connection>) -> EventLoopFuture<any Channel> {
        let credentials = current.withLockedValue { $0.credentials }
        return connection.flatMap { connection in
            connection.channel.triggerUserOutboundEvent(FabricKeepalive.Probe(), promise: nil)
            let opened = self.eventLoop.makePromise(of: Void.self)
            let stream = connection.multiplexer.createStreamChannel { stream in
                stream.eventLoop.makeCompletedFuture {
                    try stream.pipeline.syncOperations.addHandler(
                        CircuitDialer(service: service, opened: opened) { headers in
                            guard let value = headers.first(name: ControllerAddress.listHeader) else { return }
                            self.heard(ControllerAddress.list(header: value))
                        }
                    )
                }
            }
            // A stream that could not be made (the connection is closing) never answers: complete `opened` too, or
            // the promise and the futures waiting on it leak.
            stream.whenFailure { opened.fail($0) }
            return stream.and(opened.futureResult).flatMapThrowing { stream, _ -> any Channel in
                let pipeline = stream.pipeline.syncOperations
                try pipeline.addHandler(StreamDataCodec())
                try pipeline.addHandler(ByteToMessageHandler(FrameDecoder()))
                let path = CircuitPathHandler()
                try pipeline.addHandler(path)
                // The caller gets the circuit, not the stream: the circuit outlives a lost stream (resumption).
                let circuit = CircuitChannel(
                    eventLoop: stream.eventLoop,
                    allocator: stream.allocator,
                    retention: self.retention
                )
                circuit.onHeld = { circuit in self.resume(circuit, service: service, backoff: .zero) }
                circuit.start(on: path)
                try circuit.pipeline.syncOperations.addHandler(
                    E2EInitiatorHandler(
                        credentials: credentials,
                        service: service,
                        version: self.handshakeVersion,
                        suites: self.offeredSuites
                    )
                )
                return circuit
            }.flatMapErrorThrowing { error in
                if let refused = error as? CircuitRefused {
                    throw DialError.refused(code: refused.code, reason: refused.reason)
                }
                throw error
            }
        }
    }
}
