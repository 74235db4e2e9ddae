import Dispatch
package import Foundation
public import ILSCore
package import ILSCrypto
public import ILSFabric
import ILSIdentity
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

    /// The one loop of every connection, stream and circuit of this dialer: a held circuit resumes on a stream of
    /// whichever connection is up then, and a circuit takes paths only on its own loop (`CircuitChannel.attach`).
    public let eventLoop: any EventLoop
    /// The identity in use; `replaceIdentity` swaps it after a renewal (new connections and circuits use it).
    private let current: NIOLockedValueBox<Identity>
    private let connectionBox = NIOLockedValueBox<EventLoopFuture<Connection>?>(nil)
    /// Completed when the renewal under way has swapped the identity or failed (`renewIdentity`); nil when none is.
    /// Circuits and resumptions wait for it: the controller refuses the old certificate as soon as it has issued the
    /// new one, so a dial with it in between would be refused as `identity_blocked`.
    private let renewalGate = NIOLockedValueBox(RenewalGate())

    private struct RenewalGate {
        var done: EventLoopFuture<Void>?
        /// How many circuits and resumptions have waited for a renewal, all told (tests).
        var waited = 0
    }
    /// The reason of the controller's last `BlockedNotice` (the identity was revoked, disabled or deleted) and the
    /// connection it came on, until a circuit is accepted on another connection or the identity is replaced: circuits
    /// held meanwhile end with it at once, and those already resuming stop, without a resumption that the relay would
    /// refuse. (A circuit accepted on the notice's own connection was answered before the block.)
    private let blockedNotice = NIOLockedValueBox<(reason: String, connection: Int)?>(nil)
    /// Numbers the dialer's connections (`Connection.number`), so a notice names its connection for good (an object
    /// identifier can be reused once the connection is gone).
    private let connectionsMade = NIOLockedValueBox(0)

    /// Ends a held circuit with the notice's reason, if there is one; returns whether it did.
    private func endIfBlocked(_ circuit: CircuitChannel) -> Bool {
        guard let reason = blockedNotice.withLockedValue({ $0?.reason }) else { return false }
        circuit.failResumption(with: .refused(code: BlockedNotice.code, reason: reason))
        return true
    }
    /// Resumption streams asked for, all told (tests: a circuit ended by a notice asks for none).
    private let resumptionsAsked = NIOLockedValueBox(0)
    package var resumptionAttempts: Int { resumptionsAsked.withLockedValue { $0 } }

    /// The link state and who watches it (`linkStates`); each change is yielded under the lock, so in order.
    private let link = NIOLockedValueBox(LinkWatch())

    private struct LinkWatch {
        var machine = LinkStateMachine()
        var watchers: [Int: AsyncStream<LinkState>.Continuation] = [:]
        var nextWatcher = 0
    }

    /// How the controller connection notices a silent network drop (after a Wi-Fi to cellular switch, say): it is
    /// then closed, and the next circuit opens a new one.
    public let keepalive: FabricKeepalive
    /// While no circuit is open the connection sends no PING, and it closes after `idle.closeAfter` (nil: stays open
    /// without PINGs); the next circuit then opens a new one.
    public let idle: FabricKeepalive.Idle
    /// How long a circuit whose path is lost waits to be resumed, and what it may keep meanwhile.
    public let retention: CircuitRetention

    /// The dialer's clock, for the certificate's expiry (tests move it).
    package let clock: @Sendable () -> Date

    /// The end-to-end handshake this device speaks: the current version; tests play older devices with it.
    private let handshakeVersion: any E2EHandshakeVersion
    /// The record suites the device offers (nil: all of `handshakeVersion`'s). With a grace window of 0 the device
    /// cannot resume, so it does not offer the resumable suite: nothing is kept or acknowledged at either end, and
    /// the gateway ends the backend request with the path, as before resumption (docs/operations.md).
    private let offeredSuites: [E2ESuite]?
    /// Whether the dialer offers `ils-dial/2` (a circuit's ClientHello sent with its `CONNECT`); tests play a device
    /// of an earlier release without it.
    private let earlyHello: Bool

    public convenience init(
        identity: IdentityFile,
        eventLoop: any EventLoop = MultiThreadedEventLoopGroup.singleton.next(),
        keepalive: FabricKeepalive = .standard,
        idle: FabricKeepalive.Idle = .standard,
        retention: CircuitRetention = .standard
    ) throws(ILSError) {
        try self.init(
            identity: identity,
            eventLoop: eventLoop,
            keepalive: keepalive,
            idle: idle,
            handshakeVersion: E2EHandshake.version,
            retention: retention
        )
    }

    package init(
        identity: IdentityFile,
        eventLoop: any EventLoop,
        keepalive: FabricKeepalive,
        idle: FabricKeepalive.Idle = .standard,
        handshakeVersion: any E2EHandshakeVersion,
        retention: CircuitRetention = .standard,
        suites: [E2ESuite]? = nil,
        earlyHello: Bool = true,
        clock: @escaping @Sendable () -> Date = { Date() }
    ) throws(ILSError) {
        self.clock = clock
        self.eventLoop = eventLoop
        self.earlyHello = earlyHello
        self.keepalive = keepalive
        self.idle = idle
        self.retention = retention
        self.handshakeVersion = handshakeVersion
        let unresumable = handshakeVersion.suites.filter { !$0.isResumable }
        self.offeredSuites = suites ?? (retention.grace > .zero || unresumable.isEmpty ? nil : unresumable)
        self.current = NIOLockedValueBox(try Self.load(identity, earlyHello: earlyHello))
    }

    /// The identity in use: a connector per controller replica, in the order they are tried, and which one to
    /// try first (the last that answered).
    private struct Identity {
        var file: IdentityFile
        var connectors: [FabricConnector]
        var credentials: E2EHandshake.Credentials
        /// When the certificate stops being valid, read once when the file is loaded (nil if it cannot be read):
        /// each dial compares dates instead of parsing the PEM again.
        var notAfter: Date?
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
                var loaded = try? Self.load(file, earlyHello: earlyHello)
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

    private static func load(_ identity: IdentityFile, earlyHello: Bool) throws(ILSError) -> Identity {
        let alpns = earlyHello ? [FabricProtocol.dialEarlyALPN, FabricProtocol.dialALPN] : [FabricProtocol.dialALPN]
        var connectors: [FabricConnector] = []
        for address in identity.controllerAddresses {
            connectors.append(try FabricConnector(identity: identity, alpns: alpns, address: address))
        }
        // An unparseable `controller` leaves the list empty: let the connector say why, as before replicas.
        if connectors.isEmpty { connectors = [try FabricConnector(identity: identity, alpns: alpns)] }
        return Identity(
            file: identity,
            connectors: connectors,
            credentials: try E2EHandshake.Credentials(
                certificatePEM: identity.certificate,
                privateKeyPEM: identity.privateKey,
                caCertificatePEM: identity.caCertificate
            ),
            notAfter: Renewal.expiry(of: identity)
        )
    }

    /// Uses a renewed identity from now on: the next circuit opens a new controller connection with it. The old
    /// connection is left to finish the circuits it carries (the controller stops accepting new ones on it).
    public func replaceIdentity(_ identity: IdentityFile) throws(ILSError) {
        var loaded = try Self.load(identity, earlyHello: earlyHello)
        current.withLockedValue { current in
            // The replica that answered last stays first, if the new file still lists it.
            let address = current.connectors[current.preferred].address
            loaded.preferred = loaded.connectors.firstIndex { $0.address == address } ?? 0
            current = loaded
        }
        blockedNotice.withLockedValue { $0 = nil }
        connectionBox.withLockedValue { $0 = nil }
    }

    /// Renews the identity with `renew` (which returns the new file, already saved where the app keeps it) and
    /// uses it from then on, as `replaceIdentity`; circuits and resumptions asked for meanwhile wait until it is done,
    /// whether it succeeds or fails. One renewal at a time: a second call while one runs fails.
    public func renewIdentity(
        _ renew: @Sendable () async throws(ILSError) -> IdentityFile
    ) async throws(ILSError) -> IdentityFile {
        let done = eventLoop.makePromise(of: Void.self)
        let started = renewalGate.withLockedValue { gate -> Bool in
            guard gate.done == nil else { return false }
            gate.done = done.futureResult
            return true
        }
        guard started else {
            done.succeed()
            throw ILSError(.conflict, "a renewal of this identity is already under way")
        }
        defer {
            renewalGate.withLockedValue { $0.done = nil }
            done.succeed()
        }
        let renewed = try await renew()
        try replaceIdentity(renewed)
        return renewed
    }

    /// Runs `body` now, or once the renewal under way is done (`renewalGate`).
    private func afterRenewal(
        _ body: @escaping @Sendable () -> EventLoopFuture<any Channel>
    ) -> EventLoopFuture<any Channel> {
        let renewing = renewalGate.withLockedValue { gate in
            if gate.done != nil { gate.waited += 1 }
            return gate.done
        }
        guard let renewing else { return body() }
        return renewing.flatMap(body)
    }

    /// How many circuits and resumptions have waited for a renewal (`renewIdentity`), all told.
    package var waitedForRenewal: Int { renewalGate.withLockedValue { $0.waited } }

    /// The app says its network path changed (Wi-Fi to cellular, a new address, back from no network; on Apple
    /// platforms `OverlayClient.watchNetworkPath()` says it from an `NWPathMonitor`). The controller connection is
    /// closed at once, without waiting for the keepalive to find it dead: a socket bound to the old path usually
    /// never works again, and its circuits, held, resume over a new connection now instead of after the keepalive's
    /// interval and timeout (up to 35 s by default). A circuit loses nothing either way; an idle dialer just opens a
    /// new connection with its next circuit.
    public func networkChanged() {
        // No close_notify: the old path may be gone, and a TLS shutdown would wait on it. The close forgets the
        // connection and tells the link state, after its circuits are held (`connect`'s close callback).
        connectionBox.withLockedValue { $0 }?.whenSuccess {
            $0.channel.triggerUserOutboundEvent(AbruptCloseHandler.Close(), promise: nil)
        }
    }

    /// Waits until no circuit is open on the controller connection: each one ended on the wire, a cancelled one's
    /// CANCEL written to the connection's socket. Returns false if that took longer than `bound`, or if the connection
    /// closed first (its circuits are then held for resumption, or ended: a CANCEL they had not sent is not sent).
    ///
    /// What it does not cover: a circuit cancelled while held (its path lost) has no path to send its CANCEL on, and
    /// the gateway ends it when its grace window runs out; the connection an identity renewal retired
    /// (`replaceIdentity`) still carries the circuits it had, and is not waited for.
    ///
    /// A cancelled task's circuit is closed in the background, after URLSession has already reported the
    /// cancellation; a process that exits at once (a command-line tool) or an app about to be suspended can lose the
    /// CANCEL with it, and the gateway then takes the device's silence for a lost path and keeps the backend request
    /// running for its grace window (60 s by default) instead of stopping it. Call this first.
    public func circuitsEnded(within bound: Duration) async -> Bool {
        guard let connection = connectionBox.withLockedValue({ $0 }) else { return true }
        let eventLoop = self.eventLoop
        let ended = eventLoop.makePromise(of: Bool.self)
        let answered = NIOLockedValueBox(false)
        let answer: @Sendable (Bool) -> Void = { value in
            guard
                answered.withLockedValue({ done in
                    defer { done = true }
                    return !done
                })
            else { return }
            ended.succeed(value)
        }
        let timeout = eventLoop.scheduleTask(in: TimeAmount(bound)) { answer(false) }
        connection.whenComplete { result in
            guard case .success(let connection) = result else {
                timeout.cancel()
                answer(true)
                return
            }
            let streams = eventLoop.makePromise(of: Void.self)
            connection.channel.triggerUserOutboundEvent(FabricKeepalive.StreamsEnded(), promise: streams)
            streams.futureResult.whenComplete { result in
                timeout.cancel()
                // Failed: the connection closed with circuits open (now held, or ended), their CANCELs unsent.
                answer((try? result.get()) != nil)
            }
        }
        return (try? await ended.futureResult.get()) ?? false
    }

    /// The controller replica the next connection tries first (for tests).
    public var preferredController: ControllerAddress {
        current.withLockedValue { $0.connectors[$0.preferred].address }
    }

    /// A controller connection: its channel (for keepalive probes), its stream multiplexer, and whether its
    /// controller takes a circuit's ClientHello with its `CONNECT` (`ils-dial/2`).
    private struct Connection {
        let channel: any Channel
        let multiplexer: NIOHTTP2Handler.StreamMultiplexer
        let earlyHello: Bool
        /// This dialer's count of connections made when this one was (`connectionsMade`).
        let number: Int
    }

    /// What the link to the overlay is doing now (`LinkState`).
    public var linkState: LinkState { link.withLockedValue { $0.machine.state } }

    /// The link state for a UI: the current state first, then each change, in order, for as long as the caller
    /// iterates (a watcher that stops iterating is dropped).
    public var linkStates: AsyncStream<LinkState> {
        let (stream, continuation) = AsyncStream.makeStream(of: LinkState.self, bufferingPolicy: .bufferingNewest(64))
        let key = link.withLockedValue { watch -> Int in
            let key = watch.nextWatcher
            watch.nextWatcher += 1
            watch.watchers[key] = continuation
            continuation.yield(watch.machine.state)
            return key
        }
        continuation.onTermination = { [link] _ in link.withLockedValue { _ = $0.watchers.removeValue(forKey: key) } }
        return stream
    }

    /// Applies a link event and tells every watcher if the state changed.
    private func linkEvent(_ event: (inout LinkStateMachine) -> LinkState?) {
        link.withLockedValue { watch in
            guard let changed = event(&watch.machine) else { return }
            for continuation in watch.watchers.values { continuation.yield(changed) }
        }
    }

    /// The identity new connections use (`replaceIdentity` swaps it).
    package var identity: IdentityFile { current.withLockedValue { $0.file } }

    /// When the certificate in use stops being valid (nil if it cannot be read); no PEM is parsed to answer.
    package var identityNotAfter: Date? { current.withLockedValue { $0.notAfter } }

    /// Whether the dialer holds a controller connection now (or is making one): tests of the idle close.
    package var holdsConnection: Bool { connectionBox.withLockedValue { $0 != nil } }

    /// Whether the current controller connection sends each circuit's ClientHello with its `CONNECT` (tests).
    package var sendsEarlyHello: EventLoopFuture<Bool> { connection().0.map(\.earlyHello) }

    /// The live connection, connecting if there is none; `fresh` says whether it was made for this call.
    private func connection() -> (EventLoopFuture<Connection>, fresh: Bool) {
        connectionBox.withLockedValue { existing in
            if let existing { return (existing, false) }
            linkEvent { $0.connecting() }
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
        let (keepalive, idle) = (self.keepalive, self.idle)
        let connector = connectors[index]
        let mine = promise.futureResult
        let mineID = ObjectIdentifier(mine)
        connector.connect(on: eventLoop) { channel, alpn in
            let number = self.connectionsMade.withLockedValue {
                $0 += 1
                return $0
            }
            let multiplexer = try channel.pipeline.syncOperations.configureFabricHTTP2(
                mode: .client,
                keepalive: KeepaliveHandler(
                    keepalive,
                    idle: idle,
                    onSilence: { silent in
                        // By identity, not the future itself: the future holds the connection, whose HTTP/2 handler
                        // holds this handler (its stream counter), so capturing it would be a cycle that outlives
                        // the connection (LeakSanitizer found it).
                        guard box.withLockedValue({ $0.map(ObjectIdentifier.init) == mineID }) else { return }
                        self.linkEvent { $0.keepalive(silent: silent) }
                    }
                )
            )
            try channel.pipeline.syncOperations.addHandler(
                BlockedNoticeHandler { reason in
                    self.blockedNotice.withLockedValue { $0 = (reason, number) }
                    self.linkEvent { $0.identityRefused(code: BlockedNotice.code, reason: reason) }
                }
            )
            try channel.pipeline.syncOperations.addHandler(FabricConnectionErrorHandler())
            promise.succeed(
                Connection(
                    channel: channel,
                    multiplexer: multiplexer,
                    earlyHello: alpn == FabricProtocol.dialEarlyALPN,
                    number: number
                )
            )
            channel.closeFuture.whenComplete { _ in
                // Forget this connection only if it is still the current one (not after a renewal swapped it).
                let current = box.withLockedValue { box -> Bool in
                    guard box === mine else { return false }
                    box = nil
                    return true
                }
                if current { self.linkEvent { $0.connectionClosed() } }
            }
        }.whenComplete { result in
            switch result {
            case .success:
                self.linkEvent { $0.connected() }
                self.current.withLockedValue { current in
                    if let found = current.connectors.firstIndex(where: { $0.address == connector.address }) {
                        current.preferred = found
                    }
                }
            case .failure(let error):
                let reason = "\(connector.address): \((error as? ILSError)?.reason ?? "\(error)")"
                guard tries > 1 else {
                    box.withLockedValue { if $0 === mine { $0 = nil } }
                    let failure = Self.unreachable(errors + [reason])
                    self.linkEvent { $0.connectFailed(code: "controller_unreachable", reason: failure) }
                    promise.fail(DialError.controllerUnreachable(failure))
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
        afterRenewal { self.dialNow(service: service) }
    }

    private func dialNow(service: String) -> EventLoopFuture<any Channel> {
        if let expired = expired() {
            linkEvent { $0.identityRefused(code: Self.identityExpired, reason: expired.reason) }
            return eventLoop.makeFailedFuture(DialError.refused(code: Self.identityExpired, reason: expired.reason))
        }
        let (connection, fresh) = connection()
        return dial(service: service, on: connection).flatMapError { error in
            if case DialError.refused(let code, let reason) = error, Self.refusesIdentity(code) {
                self.linkEvent { $0.identityRefused(code: code, reason: reason) }
            }
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
    /// Held circuits, for the link state: each counts from its hold until it is resumed or closes.
    private let heldCircuits = NIOLockedValueBox<Set<ObjectIdentifier>>([])

    private func linkHeld(_ circuit: CircuitChannel) {
        let key = ObjectIdentifier(circuit)
        guard heldCircuits.withLockedValue({ $0.insert(key).inserted }) else { return }
        linkEvent { $0.circuitHeld() }
        circuit.closeFuture.whenComplete { _ in self.linkResumed(circuit) }
    }

    private func linkResumed(_ circuit: CircuitChannel) {
        guard heldCircuits.withLockedValue({ $0.remove(ObjectIdentifier(circuit)) != nil }) else { return }
        linkEvent { $0.circuitSettled() }
    }

    private func resume(_ circuit: CircuitChannel, service: String, backoff: TimeAmount) {
        let retry = { (reason: String) in
            let next = min(max(backoff * 2, .milliseconds(100)), .seconds(2))
            guard let until = circuit.heldUntil, circuit.eventLoop.now + next < until else {
                circuit.failResumption("no path to the gateway within the grace window (last: \(reason))")
                return
            }
            circuit.eventLoop.assumeIsolated().scheduleTask(in: next) {
                self.resume(circuit, service: service, backoff: next)
            }
        }
        guard circuit.isHeld, !endIfBlocked(circuit) else { return }
        guard let gateway = circuit.peerID, let attempt = circuit.nextAttempt() else {
            circuit.failResumption("the grace window ran out")
            return
        }
        resumptionsAsked.withLockedValue { $0 += 1 }
        openResumptionStream(service: service, gateway: gateway).hop(to: circuit.eventLoop).assumeIsolated()
            .whenComplete { result in
                switch result {
                case .success(let stream):
                    do {
                        try circuit.sendResumption(on: stream.pipeline.syncOperations, attempt: attempt) { failure in
                            guard let failure else {
                                self.linkResumed(circuit)
                                return
                            }
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
                        Self.resumptionRefusedForGood.contains(refused.code)
                    {
                        if E2ECircuitError.refusedCodes.contains(refused.code) {
                            circuit.failResumption(with: .refused(code: refused.code, reason: refused.reason))
                        } else {
                            circuit.failResumption(refused.reason)
                        }
                        return
                    }
                    retry((error as? CircuitRefused)?.reason ?? "\(error)")
                }
            }
    }

    /// The relay's refusals of a resumption that no retry cures (docs/protocol.md, "Resuming a circuit"): the circuit
    /// ends at once with the relay's reason. Any other is tried again while the grace window lasts.
    static let resumptionRefusedForGood: Set<String> = [
        "dial_denied", "identity_blocked", "unknown_service", "no_such_gateway",
    ]

    /// A stream through the controller the dialer reaches now to `gateway`'s links for `service`, opened with
    /// `FabricProtocol.resumeHeader`, its frames decoded: what a resumption's RESUME goes on.
    package func openResumptionStream(service: String, gateway: String) -> EventLoopFuture<any Channel> {
        afterRenewal { self.openResumptionStreamNow(service: service, gateway: gateway) }
    }

    private func openResumptionStreamNow(service: String, gateway: String) -> EventLoopFuture<any Channel> {
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

    /// The refusal code of a dial whose certificate has expired: it cannot renew itself, only a new enrollment helps.
    public static let identityExpired = "identity_expired"

    /// The error if the identity's certificate has expired by the dialer's clock (checked before each dial: a
    /// controller would refuse the TLS handshake with a reason the app never sees).
    private func expired() -> ILSError? {
        let (file, notAfter) = current.withLockedValue { ($0.file, $0.notAfter) }
        guard let notAfter, notAfter <= clock() else { return nil }
        return Renewal.expired(file, on: notAfter)
    }

    /// A refusal of the identity itself, not of one circuit: the link state goes `offline` with it.
    private static func refusesIdentity(_ code: String) -> Bool {
        code == "identity_blocked" || code == identityExpired
    }

    private static func connectionDied(_ error: any Error) -> Bool {
        if case DialError.refused(code: "closed", _) = error { return true }
        return error is ChannelError || error is NIOHTTP2Errors.StreamClosed
    }

    /// Opens a circuit's stream on `connection` and, once the controller accepts it, the circuit over it. On
    /// `ils-dial/2` the circuit (and its ClientHello) is set up with the stream, so the ClientHello follows the
    /// `CONNECT` in the same flight instead of one round trip later; a refusal then closes that circuit unanswered.
    private func dial(service: String, on connection: EventLoopFuture<Connection>) -> EventLoopFuture<any Channel> {
        let credentials = current.withLockedValue { $0.credentials }
        return connection.flatMap { connection in
            connection.channel.triggerUserOutboundEvent(FabricKeepalive.Probe(), promise: nil)
            let opened = self.eventLoop.makePromise(of: Void.self)
            let early = NIOLockedValueBox<CircuitChannel?>(nil)
            let stream = connection.multiplexer.createStreamChannel { stream in
                stream.eventLoop.makeCompletedFuture {
                    try stream.pipeline.syncOperations.addHandler(
                        CircuitDialer(service: service, opened: opened) { headers in
                            guard let value = headers.first(name: ControllerAddress.listHeader) else { return }
                            self.heard(ControllerAddress.list(header: value))
                        }
                    )
                    // After `CircuitDialer`, whose `CONNECT` is written first: the ClientHello follows it.
                    if connection.earlyHello {
                        let circuit = try self.circuit(on: stream, service: service, credentials: credentials)
                        early.withLockedValue { $0 = circuit }
                    }
                }
            }
            // A stream that could not be made (the connection is closing) never answers: complete `opened` too, or
            // the promise and the futures waiting on it leak.
            stream.whenFailure { opened.fail($0) }
            return stream.and(opened.futureResult).flatMapThrowing { stream, _ -> any Channel in
                // Accepted on another connection than a notice's: it no longer holds (the identity was enabled again).
                self.blockedNotice.withLockedValue { if $0?.connection != connection.number { $0 = nil } }
                if let circuit = early.withLockedValue({ $0 }) { return circuit }
                return try self.circuit(on: stream, service: service, credentials: credentials)
            }.flatMapErrorThrowing { error in
                early.withLockedValue { $0 }?.close(promise: nil)
                if let refused = error as? CircuitRefused {
                    throw DialError.refused(code: refused.code, reason: refused.reason)
                }
                throw error
            }
        }
    }

    /// The circuit over `stream`: its frames decoded, its path, the end-to-end handler (which sends the ClientHello
    /// at once). The caller gets the circuit, not the stream: the circuit outlives a lost stream (resumption).
    private func circuit(
        on stream: any Channel,
        service: String,
        credentials: E2EHandshake.Credentials
    ) throws -> CircuitChannel {
        let pipeline = stream.pipeline.syncOperations
        try pipeline.addHandler(StreamDataCodec())
        try pipeline.addHandler(ByteToMessageHandler(FrameDecoder()))
        let path = CircuitPathHandler()
        try pipeline.addHandler(path)
        let circuit = CircuitChannel(eventLoop: stream.eventLoop, allocator: stream.allocator, retention: retention)
        circuit.onHeld = { circuit in
            // The controller said why it closed the connection: the identity may no longer connect, so the relay
            // would refuse the resumption. The circuit ends with that reason now.
            if self.endIfBlocked(circuit) { return }
            self.linkHeld(circuit)
            self.resume(circuit, service: service, backoff: .zero)
        }
        circuit.start(on: path)
        try circuit.pipeline.syncOperations.addHandler(
            E2EInitiatorHandler(
                credentials: credentials,
                service: service,
                version: handshakeVersion,
                suites: offeredSuites
            )
        )
        return circuit
    }
}
