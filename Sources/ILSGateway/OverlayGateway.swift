import Dispatch
public import ILSCore
import ILSCrypto
public import ILSFabric
import ILSIdentity
public import ILSProxy
public import Logging
import NIOConcurrencyHelpers
public import NIOCore
import NIOHTTP2
import NIOPosix
public import ServiceLifecycle

/// `serve --mode ziti`: the dark gateway. It opens no listening socket of any kind: it dials out to the controller
/// (mTLS, `ils-host/1`), hosts one service, and serves each circuit the controller opens to it — end-to-end
/// handshake, its own access decision, then the same proxy core as HTTP mode. After a lost connection it reconnects
/// forever with jittered backoff capped at a few seconds.
///
/// With controller replicas it links to every one it knows of: those in the identity file and those in the latest
/// list a controller sent (`HostControlMessage.controllers`), since a device's circuit reaches the gateway through
/// whichever replica the device reached. A replica that appears in a list is linked at once; one that leaves every
/// list is no longer redialled (its live links finish); one merely down is redialled while it is listed.
public final class OverlayGateway: Service, Sendable {
    /// The identity in use: replaced when the certificate is renewed (new connections and circuits use it), with a
    /// connector per controller replica, made when first dialled.
    private let identity: NIOLockedValueBox<LoadedIdentity>

    private struct LoadedIdentity {
        var file: IdentityFile
        var credentials: E2EHandshake.Credentials
        var connectors: [ControllerAddress: FabricConnector]
    }
    /// Renews the certificate when due and notices one renewed in the identity file by someone else; `nil` without
    /// an identity file path (renewal is then left to `ils-gateway renew` and a restart).
    private let keeper: IdentityKeeper?
    private let service: String
    private let handshakeTimeout: TimeAmount
    private let keepalive: FabricKeepalive
    private let core: ProxyCore
    private let logger: Logger
    private let policy = GatewayPolicy()
    /// Every resumable circuit, attached or held, for a resumption to find whichever link it comes on.
    private let circuits: ResumableCircuits
    private let retention: CircuitRetention
    /// Hands freed memory back to the system (`MemoryRelease`); nil where the allocator has no trim.
    private let releaseMemory: (@Sendable () -> Void)?
    private let eventLoop: any EventLoop
    private let links: NIOLockedValueBox<Links>
    /// Connect loops to start (a new replica, or more relay loops learnt from one); `run` starts one for each.
    private let starts = AsyncStream.makeStream(of: LinkKey.self)

    /// One link: to which controller replica, and which of its relay loops' slots.
    struct LinkKey: Hashable, Sendable {
        let controller: ControllerAddress
        let slot: Int
    }

    /// The gateway's connections to the controllers ("links"). A controller's relay runs several event loops and
    /// splices each circuit onto a gateway connection on the device connection's own loop when there is one, so
    /// the gateway keeps one link per relay loop of each replica (it is told, on each link, which loop it landed
    /// on). Every link carries the control stream and circuits alike; the gateway is hosting while any of them is up.
    /// Each link's lifecycle is a `LinkMachine`; this is the set of them and what they share.
    private struct Links {
        /// One link slot with a connect loop running.
        struct Slot {
            var machine = LinkMachine()
            /// The live connection of the machine's link, and what wakes its connect loop: the connection's close, or
            /// a renewal that replaces it.
            var channel: (any Channel)?
            var wake: EventLoopPromise<Void>?
        }

        var slots: [LinkKey: Slot] = [:]
        /// How many slots each replica's relay can use (one until it says).
        var slotCounts: [ControllerAddress: Int] = [:]
        var stopped = false
        /// The last refusal logged, so a refused gateway says why once, not at every retry.
        var lastRefusal: String?
        /// The replicas the identity file names, its `controller` first.
        var fileControllers: [ControllerAddress]
        /// The latest list a controller sent.
        var pushedControllers: [ControllerAddress] = []

        /// Every replica to link to: the file's, then the pushed ones.
        var listed: [ControllerAddress] {
            var seen = Set(fileControllers)
            return fileControllers + pushedControllers.filter { seen.insert($0).inserted }
        }

        /// Whether any link is connected (bound or not yet answered).
        var anyConnected: Bool { slots.values.contains { $0.machine.link != nil } }

        /// The bound links' relay loops, by slot.
        var boundLoops: [LinkKey: Int] { slots.compactMapValues { $0.machine.bound?.relayLoop } }

        /// The slots that should have a connect loop and have none; given a slot each.
        mutating func missing() -> [LinkKey] {
            guard !stopped else { return [] }
            var keys: [LinkKey] = []
            for controller in listed {
                for slot in 0..<slotCounts[controller, default: 1] {
                    let key = LinkKey(controller: controller, slot: slot)
                    if slots[key] == nil {
                        slots[key] = Slot()
                        keys.append(key)
                    }
                }
            }
            return keys
        }

        /// `key`'s connect loop dials with `certificate`, unless the gateway stopped or the replica left every list:
        /// its slot then goes, decided in the same lock as `missing`, so a replica listed again at that moment gets a
        /// new loop.
        mutating func dial(_ key: LinkKey, certificate: String) -> Bool {
            guard !stopped, listed.contains(key.controller), slots[key]?.machine.dial(certificate: certificate) == true
            else {
                slots[key] = nil
                return false
            }
            return true
        }

        mutating func connected(_ key: LinkKey, _ channel: any Channel, wake: EventLoopPromise<Void>)
            -> LinkMachine
            .Connected
        {
            guard let result = slots[key]?.machine.connected(ObjectIdentifier(channel)) else { return .close }
            if result == .keep {
                slots[key]?.channel = channel
                slots[key]?.wake = wake
            }
            return result
        }

        /// `key`'s link `channel` ended or was rotated away; also whether no link is connected any more.
        mutating func ended(_ key: LinkKey, _ channel: any Channel) -> (next: LinkMachine.Next, lastLink: Bool) {
            guard let next = slots[key]?.machine.ended(ObjectIdentifier(channel)) else { return (.stop, !anyConnected) }
            if slots[key]?.channel === channel {
                slots[key]?.channel = nil
                slots[key]?.wake = nil
            }
            return (next, !anyConnected)
        }

        /// The controller accepted `key`'s link `connection` on `relayLoop` of `relayLoops`; `more` if that is more
        /// loops than the replica has slots (within `maximumLinks`).
        mutating func accepted(_ key: LinkKey, _ connection: any Channel, relayLoop: Int?, relayLoops: Int?) -> (
            LinkMachine.Acceptance, more: Bool
        ) {
            let taken = relayLoop.map { loop in
                boundLoops.contains { $0.key.controller == key.controller && $0.key != key && $0.value == loop }
            }
            let acceptance =
                slots[key]?.machine.accepted(
                    ObjectIdentifier(connection),
                    relayLoop: relayLoop,
                    loopTaken: taken ?? false,
                    relayLoops: relayLoops
                ) ?? .stale
            guard acceptance == .bound else { return (acceptance, false) }
            lastRefusal = nil
            let wanted = min(relayLoops ?? 1, OverlayGateway.maximumLinks)
            guard wanted > slotCounts[key.controller, default: 1], !stopped else { return (.bound, false) }
            slotCounts[key.controller] = wanted
            return (.bound, true)
        }

        /// A renewal: every connected link is replaced; returns each with what wakes its connect loop.
        mutating func rotate() -> [(any Channel, EventLoopPromise<Void>?)] {
            var old: [(any Channel, EventLoopPromise<Void>?)] = []
            for key in slots.keys {
                guard slots[key]?.machine.rotate() != nil, let channel = slots[key]?.channel else { continue }
                old.append((channel, slots[key]?.wake))
                slots[key]?.channel = nil
                slots[key]?.wake = nil
            }
            return old
        }

        /// Stops every link: the connections to close.
        mutating func stop() -> [any Channel] {
            stopped = true
            for key in slots.keys { _ = slots[key]?.machine.stop() }
            return slots.values.compactMap(\.channel)
        }
    }

    /// At most this many links, whatever the controller's loop count.
    static let maximumLinks = 16

    /// - Parameters:
    ///   - identityPath: the identity file, so the gateway can renew its certificate by itself before it expires;
    ///     without it, renewal is left to `ils-gateway renew`.
    ///   - keepalive: how each link notices that the controller is gone when the network drops it silently.
    public init(
        identity: IdentityFile,
        identityPath: String? = nil,
        service: String,
        proxy: ProxyConfiguration,
        logger: Logger,
        handshakeTimeout: TimeAmount = E2EResponderHandler.handshakeTimeout,
        keepalive: FabricKeepalive = .standard,
        retention: CircuitRetention = .standard,
        releaseMemory: (@Sendable () -> Void)? = nil
    ) throws(ILSError) {
        guard identity.identity.role == .gateway else {
            throw ILSError(
                .permissionDenied,
                "identity '\(identity.identity.name)' has role \(identity.identity.role.rawValue); serving needs a gateway identity"
            )
        }
        let loaded = try Self.load(identity)
        self.identity = NIOLockedValueBox(loaded)
        self.links = NIOLockedValueBox(Links(fileControllers: identity.controllerAddresses))
        self.keeper = identityPath.map { IdentityKeeper(path: $0, current: identity) }
        self.service = service
        self.handshakeTimeout = handshakeTimeout
        self.keepalive = keepalive
        self.retention = retention
        self.releaseMemory = releaseMemory
        // One line a minute per identity for resumptions, and one a minute for expiries, each with the count since
        // the last: 300 resumptions made 300 lines (issue 49), and a network that drops every device at once makes
        // as many expiries.
        let resumptions = LogTally<String>(interval: .seconds(60))
        let expiries = LogTally<Bool>(interval: .seconds(60))
        self.circuits = ResumableCircuits(
            onExpired: { [logger] in
                GatewayMetrics.circuitsNotResumed.increment()
                guard let count = expiries.record(key: true) else { return }
                logger.notice(
                    "a held circuit was not resumed within the grace window; its backend request is cancelled (once a minute)",
                    metadata: ["since_last_line": "\(count)"]
                )
            },
            onResumed: { [logger] identityID in
                GatewayMetrics.circuitsResumed.increment()
                guard let count = resumptions.record(key: identityID) else { return }
                logger.notice(
                    "circuit resumed (once a minute per identity)",
                    metadata: ["identity_id": "\(identityID)", "since_last_line": "\(count)"]
                )
            }
        )
        // One event loop carries the controller connections, their circuits and their backend connections, so a
        // circuit and its backend request never hop threads. Resumption depends on it: a circuit held after its path's
        // connection died is resumed on a stream of another connection, and a circuit takes paths only on its own loop
        // (`CircuitChannel.attach`; `ResumableCircuits` refuses a resumption from another loop as "no such circuit").
        self.eventLoop = MultiThreadedEventLoopGroup.singleton.next()
        // All backend connections live on that one loop, so it gets the whole `--backend-max-connections`: split
        // between the machine's cores, half of it would answer 503 beyond ~8,000 concurrent streams.
        self.core = ProxyCore(
            configuration: proxy.countingStalls(GatewayMetrics.circuitStalled),
            logger: logger,
            loopCount: 1
        )
        self.logger = logger
    }

    private static func load(_ file: IdentityFile) throws(ILSError) -> LoadedIdentity {
        // The file's own controller is checked now, so an unusable identity fails at start as before replicas.
        let connector = try FabricConnector(identity: file, alpn: FabricProtocol.hostALPN)
        return LoadedIdentity(
            file: file,
            credentials: try E2EHandshake.Credentials(
                certificatePEM: file.certificate,
                privateKeyPEM: file.privateKey,
                caCertificatePEM: file.caCertificate
            ),
            connectors: [connector.address: connector]
        )
    }

    /// The connector for `controller` with the identity in use, made on first use.
    private func connector(for controller: ControllerAddress) throws(ILSError) -> (
        FabricConnector, E2EHandshake.Credentials
    ) {
        let loaded = identity.withLockedValue { $0 }
        if let connector = loaded.connectors[controller] { return (connector, loaded.credentials) }
        let connector = try FabricConnector(identity: loaded.file, alpn: FabricProtocol.hostALPN, address: controller)
        identity.withLockedValue { current in
            // Not if a renewal replaced the identity meanwhile: that one makes its own.
            if current.file.certificate == loaded.file.certificate { current.connectors[controller] = connector }
        }
        return (connector, loaded.credentials)
    }

    /// Moves to a renewed certificate at once without cutting a stream: every link is dialled again with it, and
    /// the old links finish their circuits and close (the relay routes no new circuit to a link whose certificate is
    /// no longer current). Returns whether the certificate could be used.
    private func adopt(_ change: IdentityKeeper.Change) -> Bool {
        let file: IdentityFile
        switch change {
        case .renewed(let renewed):
            file = renewed
            logger.info("certificate renewed", metadata: ["until": "\(renewed.identity.certificateNotAfter ?? 0)"])
        case .changedOnDisk(let changed):
            file = changed
            logger.info(
                "the identity file has a new certificate; re-linking with it",
                metadata: ["until": "\(changed.identity.certificateNotAfter ?? 0)"]
            )
        case .renewalFailed(let error):
            logger.warning("certificate renewal failed; will retry", metadata: ["error": "\(error.reason)"])
            return false
        }
        do {
            let loaded = try Self.load(file)
            identity.withLockedValue { $0 = loaded }
        } catch {
            logger.warning("the new certificate cannot be used", metadata: ["error": "\(error.reason)"])
            return false
        }
        links.withLockedValue { $0.fileControllers = file.controllerAddresses }
        rotateLinks()
        startMissingLinks()
        return true
    }

    public func run() async throws {
        // A cancelled run stops as a graceful shutdown does. Without it the connect loops went on after the task was
        // cancelled, and each cancelled sleep returned at once: a gateway whose controller was gone redialled it
        // about a thousand times a second, for as long as the process lived.
        await withTaskCancellationHandler {
            await withGracefulShutdownHandler {
                await withDiscardingTaskGroup { group in
                    if let keeper = self.keeper {
                        group.addTask { await keeper.run { self.adopt($0) } }
                    }
                    if let release = self.releaseMemory {
                        // What held circuits kept (up to `--resume-total`) goes back once they close (issue 49: 448
                        // MB of RSS stayed after 400 held circuits expired).
                        group.addTask { await MemoryRelease.run(closed: { self.circuits.closed }, release: release) }
                    }
                    self.startMissingLinks()
                    for await key in self.starts.stream {
                        group.addTask { await self.connectLoop(key) }
                    }
                    group.cancelAll()
                }
                // Every connect loop has ended; a slot whose loop a cancelled stream never started goes too.
                self.links.withLockedValue { $0.slots = [:] }
            } onGracefulShutdown: {
                self.stop()
            }
        } onCancel: {
            self.stop()
        }
    }

    /// Stops reconnecting, ends every circuit, and closes every link.
    ///
    /// Resumable circuits end first, cut on purpose while the links can still carry that: CANCEL, then a reset of
    /// the stream, so each device reports its answer as `truncated` now. Closed with the links instead, they looked
    /// lost to their devices, which resumed against a gateway that was going: `not_resumed` 2.24 s later if it came
    /// back, nothing until the end of the grace window if not (issue 49). The links close once every circuit has, or
    /// after `stopLinger` whatever is left. Held circuits have no path: they end at once, and their backend requests
    /// with them. Aborted, not closed: a plain close between a request and its answer's head was a clean end (a
    /// FINAL), and a held circuit that ended cleanly lingered for its device for the whole grace window (CI at stop
    /// 46: 71 circuits and 22,720 bytes kept long after the gateway stopped). Circuits of the other suites end with
    /// their links (a reset, `truncated` at the device: they are not resumable).
    public func stop() {
        let channels = links.withLockedValue { $0.stop() }
        starts.continuation.finish()
        let ended = circuits.closeAll { CircuitCloseHandler.abort($0) }
        guard let loop = channels.first?.eventLoop else { return }
        let closed = NIOLockedValueBox(false)
        let closeLinks: @Sendable () -> Void = {
            let first = closed.withLockedValue { closed -> Bool in
                if closed { return false }
                closed = true
                return true
            }
            if first { for channel in channels { channel.close(promise: nil) } }
        }
        EventLoopFuture.andAllComplete(ended, on: loop).whenComplete { _ in closeLinks() }
        loop.scheduleTask(in: Self.stopLinger) { closeLinks() }
    }

    /// How long a stopping gateway's links wait for its circuits' CANCELs to be written before they close anyway.
    static let stopLinger: TimeAmount = .seconds(1)

    /// Resumable circuits open now, and how many of them are held (their path lost, waiting for the device).
    public var resumableCircuits: (registered: Int, held: Int) { circuits.counts }

    /// Resumptions this gateway accepted.
    public var resumedCount: Int { circuits.resumed }
    /// Held circuits whose grace window ran out here.
    public var expiredCount: Int { circuits.expired }

    /// The bytes this gateway's circuits keep for resumption (what the devices have not acknowledged).
    public var retainedBytes: Int { retention.budget.bytes }

    /// Records what held circuits cost now in the gauges (`ils_gateway_circuits_held`,
    /// `ils_gateway_resumption_kept_bytes`); the metrics listener calls it at each scrape.
    public func recordHeldGauges() {
        GatewayMetrics.circuitsHeld.record(circuits.counts.held)
        GatewayMetrics.keptBytes.record(retention.budget.bytes)
        GatewayMetrics.heldBytes.record(retention.budget.heldBytes)
        for bound in RetentionBudget.Refusal.allCases {
            let now = retention.budget.refused(bound)
            let new = notHeldCounted.withLockedValue { counted in
                defer { counted[bound] = now }
                return now - counted[bound, default: 0]
            }
            if new > 0 { GatewayMetrics.notHeld(bound, count: new) }
        }
    }

    /// The refusals of `RetentionBudget.hold` already counted in `ils_gateway_circuits_not_held_total`.
    private let notHeldCounted = NIOLockedValueBox<[RetentionBudget.Refusal: Int]>([:])

    /// What this gateway's held circuits keep, with their reservations (at most its total).
    public var heldRetainedBytes: Int { retention.budget.heldBytes }

    /// Circuits that lost their path and were not held, by the bound that refused them.
    public func notHeld(_ bound: RetentionBudget.Refusal) -> Int { retention.budget.refused(bound) }

    /// Whether the gateway's own block list holds this identity (revoked or disabled).
    public func blocks(identityID: String) -> Bool { policy.blocks(identityID) }

    /// Whether the gateway is connected and has its policy from the controller (for tests and readiness).
    public var isHosting: Bool { links.withLockedValue { $0.anyConnected } && policy.isKnown }

    /// Backend connections whose reads are held because their circuit cannot take more (tests: backpressure).
    package var heldBackendReads: Int { core.pools.heldReads }

    /// How many of the identity file's controller's relay loops this gateway has a bound link on (for tests).
    public var relayLoopsCovered: Int {
        links.withLockedValue { links in
            Set(links.boundLoops.filter { $0.key.controller == links.fileControllers.first }.values).count
        }
    }

    /// The controller replicas this gateway has a bound link to (for tests and readiness).
    public var linkedControllers: Set<ControllerAddress> {
        links.withLockedValue { Set($0.boundLoops.keys.map(\.controller)) }
    }

    /// The controller replicas this gateway links to, or keeps dialling: its identity file's and the latest list
    /// a controller sent.
    public var listedControllers: [ControllerAddress] { links.withLockedValue { $0.listed } }

    /// The controller replicas this gateway has a connect loop for, linked or redialling (for tests).
    public var diallingControllers: Set<ControllerAddress> {
        links.withLockedValue { Set($0.slots.keys.map(\.controller)) }
    }

    /// Starts a connect loop for every slot of every listed replica that has none.
    private func startMissingLinks() {
        let keys = links.withLockedValue { $0.missing() }
        for key in keys { starts.continuation.yield(key) }
    }

    /// A controller sent its list of replicas: link to the new ones now; those no longer listed are not redialled.
    /// Each controller lists itself first, so the same cluster arrives in as many orders as it has controllers: only
    /// a different set is a change.
    private func controllersChanged(_ list: [String]) {
        let pushed = ControllerAddress.replicas(list)
        let changed = links.withLockedValue { links -> Bool in
            guard Set(links.pushedControllers) != Set(pushed) else { return false }
            links.pushedControllers = pushed
            return true
        }
        guard changed else { return }
        logger.info("controller list", metadata: ["controllers": "\(pushed.map(\.description))"])
        // Kept in the identity file too: after a restart, the gateway links to replicas that joined since enrollment
        // even while the file's own controller is down.
        if let path = keeper?.path {
            // Off the link's event loop (a file write and fsync), in the order the lists came.
            IdentityFileIO.learnInBackground(
                pushed,
                path: path,
                certificate: identity.withLockedValue { $0.file.certificate }
            )
        }
        startMissingLinks()
    }

    private var stopped: Bool { links.withLockedValue { $0.stopped } }

    /// Keeps link `key` up while its replica is listed: dials, waits for it to close, dials again after the wait its
    /// `LinkMachine` says. Slot 0 of each replica reports to the log at info; the others, which come and go with it,
    /// at debug.
    private func connectLoop(_ key: LinkKey) async {
        let slot = key.slot
        var lastFailure: String?
        let level: Logger.Level = slot == 0 ? .info : .debug
        while dial(key) {
            let next: LinkMachine.Next
            do {
                let channel = try await connect(key).get()
                let wake = channel.eventLoop.makePromise(of: Void.self)
                switch links.withLockedValue({ $0.connected(key, channel, wake: wake) }) {
                case .keep: break
                case .close:
                    wake.succeed()  // kept by no slot: nothing waits on it
                    channel.close(promise: nil)
                    continue
                case .replace:
                    wake.succeed()
                    channel.triggerUserOutboundEvent(LinkDrainHandler.Drain(), promise: nil)
                    continue
                }
                lastFailure = nil
                logger.log(
                    level: level,
                    "connected to controller",
                    metadata: [
                        "controller": "\(key.controller)",
                        "service": "\(service)",
                        "link": "\(slot)",
                    ]
                )
                recordLinks()
                // Either the link closes, or a renewal asks this slot to link again while the old link drains.
                channel.closeFuture.whenComplete { _ in wake.succeed() }
                try? await wake.futureResult.get()
                let (ended, lastLink) = links.withLockedValue { $0.ended(key, channel) }
                recordLinks()
                // A renewal replaced it: dial again now, with the new certificate.
                if case .dial(_, because: .rotated) = ended { continue }
                // The replica's grant stays while its links are down (`GatewayPolicy.Grants`): it may be the one that
                // made a narrowing the others have not heard of. It goes when the replica leaves the list.
                if lastLink { policy.connectionLost() }
                next = ended
            } catch {
                let description = (error as? ILSError)?.reason ?? "\(error)"
                if description != lastFailure, slot == 0 {
                    logger.warning(
                        "cannot reach the controller; retrying with backoff",
                        metadata: [
                            "controller": "\(key.controller)",
                            "error": "\(description)",
                        ]
                    )
                    lastFailure = description
                } else {
                    logger.debug(
                        "controller still unreachable",
                        metadata: ["controller": "\(key.controller)", "error": "\(description)", "link": "\(slot)"]
                    )
                }
                next = links.withLockedValue { $0.slots[key]?.machine.dialFailed() } ?? .stop
            }
            guard case .dial(let wait, let because) = next else { break }
            switch because {
            case .refused(let code):
                // A certificate replaced by a renewal made elsewhere: move to the new one at once.
                if keeper?.movedOn(afterRefusal: code, adopt: adopt) == true { continue }
                logger.debug(
                    "link refused; waiting before the next try",
                    metadata: ["wait": "\(wait.nanoseconds / 1_000_000_000)s"]
                )
            case .lost:
                logger.log(
                    level: slot == 0 ? .warning : .debug,
                    "lost the controller connection; reconnecting",
                    metadata: ["controller": "\(key.controller)"]
                )
            case .rotated, .duplicate, .failed:
                break
            }
            if wait > .zero { try? await Task.sleep(nanoseconds: UInt64(wait.nanoseconds)) }
        }
        // A replica no longer listed whose last link is gone: its block list goes with it.
        let forget = links.withLockedValue { links in
            !links.listed.contains(key.controller) && !links.slots.keys.contains { $0.controller == key.controller }
        }
        if forget {
            policy.forgetRevoked(from: key.controller.description)
            logger.info(
                "no longer linking to a controller that left the list",
                metadata: ["controller": "\(key.controller)"]
            )
        }
    }

    /// Whether `key`'s connect loop dials (again), with the certificate in use now.
    private func dial(_ key: LinkKey) -> Bool {
        let certificate = identity.withLockedValue { $0.file.certificate }
        return links.withLockedValue { $0.dial(key, certificate: certificate) }
    }

    /// After a renewal: every link is dialled again with the new certificate, and each old link closes once its
    /// circuits have ended.
    private func rotateLinks() {
        let old = links.withLockedValue { $0.rotate() }
        for (channel, wake) in old {
            channel.triggerUserOutboundEvent(LinkDrainHandler.Drain(), promise: nil)
            wake?.succeed()
        }
    }

    /// The controller refused link `slot`'s binding: logged once per distinct reason (a gateway that is refused
    /// retries for as long as it runs; the admin must see why, not a line every few minutes).
    private func refused(_ key: LinkKey, connection: any Channel, reason: String, code: String?) {
        let first = links.withLockedValue { links -> Bool in
            _ = links.slots[key]?.machine.refused(ObjectIdentifier(connection), reason: reason, code: code)
            defer { links.lastRefusal = reason }
            return links.lastRefusal != reason
        }
        let permanent = code == HostControlMessage.identityBlocked
        logger.log(
            level: first ? .error : .debug,
            permanent
                ? "the controller refused this gateway's identity; retrying every few minutes"
                : "the controller refused to let this gateway host the service",
            metadata: ["reason": "\(reason)", "service": "\(service)", "controller": "\(key.controller)"]
        )
    }

    private func recordLinks() {
        let count = links.withLockedValue { links in links.slots.values.count { $0.machine.link != nil } }
        GatewayMetrics.connected.record(count > 0 ? 1 : 0)
        GatewayMetrics.links.record(count)
    }

    /// The controller accepted link `key`'s binding, on relay loop `relayLoop` of `relayLoops`. A link on a loop
    /// another link to the same replica already has is dropped and dialled again (at once a few times, then with
    /// backoff: `LinkMachine`); the first answer that names more loops than there are links starts the missing ones.
    private func bound(_ key: LinkKey, connection: any Channel, relayLoop: Int?, relayLoops: Int?) {
        let slot = key.slot
        logger.log(
            level: slot == 0 ? .info : .debug,
            "hosting service",
            metadata: [
                "service": "\(service)", "controller": "\(key.controller)", "link": "\(slot)",
                "relay_loop": "\(relayLoop.map(String.init) ?? "-")", "aead": "\(AESGCMRecords.backend)",
            ]
        )
        let (acceptance, more) = links.withLockedValue {
            $0.accepted(key, connection, relayLoop: relayLoop, relayLoops: relayLoops)
        }
        if acceptance == .duplicate {
            connection.close(promise: nil)
            return
        }
        if more { startMissingLinks() }
    }

    private func connect(_ key: LinkKey) -> EventLoopFuture<any Channel> {
        let slot = key.slot
        let connector: FabricConnector
        let credentials: E2EHandshake.Credentials
        do {
            (connector, credentials) = try self.connector(for: key.controller)
        } catch {
            return eventLoop.makeFailedFuture(error)
        }
        var settings = GatewayStreamRouter.Context(
            service: service,
            credentials: credentials,
            policy: policy,
            core: core,
            logger: logger,
            onRefusal: { [weak self] connection, reason, code in
                guard let connection else { return }
                self?.refused(key, connection: connection, reason: reason, code: code)
            }
        )
        settings.controller = key.controller.description
        settings.handshakeTimeout = handshakeTimeout
        settings.circuits = circuits
        settings.retention = retention
        settings.onBound = { [weak self] connection, relayLoop, relayLoops in
            self?.bound(key, connection: connection, relayLoop: relayLoop, relayLoops: relayLoops)
        }
        settings.onControllers = { [weak self] list in self?.controllersChanged(list) }
        let router = settings
        let logger = self.logger
        let keepalive = self.keepalive
        return connector.connect(on: eventLoop) { channel in
            var router = router
            router.binding = LinkBinding(eventLoop: channel.eventLoop)
            let shared = GatewayStreamRouter.Shared(router)
            let drain = LinkDrainHandler()
            try channel.pipeline.syncOperations.configureFabricHTTP2(
                mode: .server,
                keepalive: KeepaliveHandler(keepalive) { [logger] in
                    logger.warning(
                        "the controller link went silent (no answer to a keepalive PING); closing it and redialling",
                        metadata: [
                            "controller": "\(key.controller)", "link": "\(slot)", "timeout": "\(keepalive.timeout)",
                        ]
                    )
                },
                streamDelegate: drain
            ) {
                GatewayStreamRouter(shared)
            }
            try channel.pipeline.syncOperations.addHandler(drain)
            try channel.pipeline.syncOperations.addHandler(
                FabricConnectionErrorHandler { [logger] error in
                    logger.warning("controller connection failed; reconnecting", metadata: ["error": "\(error)"])
                }
            )
        }
    }
}
