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
    private struct Links {
        /// Live links.
        var channels: [LinkKey: any Channel] = [:]
        /// The relay loop of each bound link.
        var relayLoops: [LinkKey: (loop: Int, connection: ObjectIdentifier)] = [:]
        /// Consecutive times a slot landed on a loop another link to its controller already had.
        var duplicates: [LinkKey: Int] = [:]
        /// Slots whose link was closed for landing on a taken loop: they dial again, at once (`true`) or after the
        /// usual backoff.
        var redial: [LinkKey: Bool] = [:]
        /// How many slots each replica's relay can use (one until it says).
        var slots: [ControllerAddress: Int] = [:]
        var stopped = false
        /// How each slot's current link ended its binding: accepted, or refused with the controller's reason.
        var outcomes: [LinkKey: LinkOutcome] = [:]
        /// Completed to make a slot link again at once (after a renewal) while its old link drains.
        var rotations: [LinkKey: EventLoopPromise<Void>] = [:]
        /// Links replaced after a renewal, finishing their circuits.
        var draining: [ObjectIdentifier: any Channel] = [:]
        /// The last refusal logged, so a refused gateway says why once, not at every retry.
        var lastRefusal: String?
        /// The replicas the identity file names, its `controller` first.
        var fileControllers: [ControllerAddress]
        /// The latest list a controller sent.
        var pushedControllers: [ControllerAddress] = []
        /// Slots with a connect loop running.
        var running: Set<LinkKey> = []

        /// Every replica to link to: the file's, then the pushed ones.
        var listed: [ControllerAddress] {
            var seen = Set(fileControllers)
            return fileControllers + pushedControllers.filter { seen.insert($0).inserted }
        }

        /// The slots that should have a connect loop and have none; marked running.
        mutating func missing() -> [LinkKey] {
            guard !stopped else { return [] }
            var keys: [LinkKey] = []
            for controller in listed {
                for slot in 0..<slots[controller, default: 1] {
                    let key = LinkKey(controller: controller, slot: slot)
                    if running.insert(key).inserted { keys.append(key) }
                }
            }
            return keys
        }

        /// Whether `key`'s connect loop goes on dialling: not once the gateway stops or its replica left every list.
        /// Its loop is then no longer running, decided in the same lock as `missing`, so a replica listed again at
        /// that moment gets a new loop.
        mutating func keepsDialling(_ key: LinkKey) -> Bool {
            guard stopped || !listed.contains(key.controller) else { return true }
            running.remove(key)
            return false
        }
    }

    enum LinkOutcome {
        case bound
        case refused(reason: String, code: String?)
    }

    /// At most this many links, whatever the controller's loop count.
    static let maximumLinks = 16
    /// A link that lands on a loop another link has is dropped and dialled again: at once up to this many times in a
    /// row (per relay loop: connections land on the loops in turn, other peers' interleaved), then with backoff.
    static let quickRetriesPerLoop = 4

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
        retention: CircuitRetention = .standard
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
        self.circuits = ResumableCircuits(
            onExpired: { [logger] in
                GatewayMetrics.circuitsNotResumed.increment()
                logger.notice(
                    "a held circuit was not resumed within the grace window; its backend request is cancelled"
                )
            },
            onResumed: { [logger] identityID in
                GatewayMetrics.circuitsResumed.increment()
                logger.info("circuit resumed", metadata: ["identity_id": "\(identityID)"])
            }
        )
        // One event loop carries the controller connection, its circuits and their backend connections, so a
        // circuit and its backend request never hop threads.
        self.eventLoop = MultiThreadedEventLoopGroup.singleton.next()
        // All backend connections live on that one loop, so it gets the whole `--backend-max-connections`: split
        // between the machine's cores, half of it would answer 503 beyond ~8,000 concurrent streams.
        self.core = ProxyCore(configuration: proxy, logger: logger, loopCount: 1)
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
        await withGracefulShutdownHandler {
            await withDiscardingTaskGroup { group in
                if let keeper = self.keeper {
                    group.addTask { await keeper.run { self.adopt($0) } }
                }
                self.startMissingLinks()
                for await key in self.starts.stream {
                    group.addTask { await self.connectLoop(key) }
                }
                group.cancelAll()
            }
        } onGracefulShutdown: {
            self.stop()
        }
    }

    /// Stops reconnecting and closes every link (and with them every circuit).
    public func stop() {
        let channels = links.withLockedValue { links -> [any Channel] in
            links.stopped = true
            return Array(links.channels.values)
        }
        starts.continuation.finish()
        for channel in channels { channel.close(promise: nil) }
        // Held circuits have no link to close with: they end now, and their backend requests with them.
        circuits.closeAll()
    }

    /// Resumable circuits open now, and how many of them are held (their path lost, waiting for the device).
    public var resumableCircuits: (registered: Int, held: Int) { circuits.counts }

    /// Resumptions this gateway accepted.
    public var resumedCount: Int { circuits.resumed }
    /// Held circuits whose grace window ran out here.
    public var expiredCount: Int { circuits.expired }

    /// The bytes this gateway's circuits keep for resumption (what the devices have not acknowledged).
    public var retainedBytes: Int { retention.budget.bytes }

    /// Whether the gateway's own block list holds this identity (revoked or disabled).
    public func blocks(identityID: String) -> Bool { policy.blocks(identityID) }

    /// Whether the gateway is connected and has its policy from the controller (for tests and readiness).
    public var isHosting: Bool { links.withLockedValue { !$0.channels.isEmpty } && policy.isKnown }

    /// Backend connections whose reads are held because their circuit cannot take more (tests: backpressure).
    package var heldBackendReads: Int { core.pools.heldReads }

    /// How many of the identity file's controller's relay loops this gateway has a bound link on (for tests).
    public var relayLoopsCovered: Int {
        links.withLockedValue { links in
            Set(links.relayLoops.filter { $0.key.controller == links.fileControllers.first }.values.map(\.loop)).count
        }
    }

    /// The controller replicas this gateway has a bound link to (for tests and readiness).
    public var linkedControllers: Set<ControllerAddress> {
        links.withLockedValue { Set($0.relayLoops.keys.map(\.controller)) }
    }

    /// The controller replicas this gateway links to, or keeps dialling: its identity file's and the latest list
    /// a controller sent.
    public var listedControllers: [ControllerAddress] { links.withLockedValue { $0.listed } }

    /// The controller replicas this gateway has a connect loop for, linked or redialling (for tests).
    public var diallingControllers: Set<ControllerAddress> {
        links.withLockedValue { Set($0.running.map(\.controller)) }
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

    /// Keeps link `key` up while its replica is listed: dials, waits for it to close, dials again with jittered
    /// backoff. Slot 0 of each replica reports to the log at info; the others, which come and go with it, at debug.
    /// Waits between tries as `LinkBackoff` says.
    private func connectLoop(_ key: LinkKey) async {
        let slot = key.slot
        var backoff = LinkBackoff()
        // Links that landed on a relay loop another link has: not reset by each connection, unlike `backoff`, and
        // slower, since the controller is up and the link is only redundant.
        var duplicateBackoff = Backoff(maximum: .seconds(3))
        var lastFailure: String?
        let level: Logger.Level = slot == 0 ? .info : .debug
        while links.withLockedValue({ $0.keepsDialling(key) }), !stopped {
            do {
                let channel = try await connect(key).get()
                let rotation = channel.eventLoop.makePromise(of: Void.self)
                let stopped = links.withLockedValue { links -> Bool in
                    links.channels[key] = channel
                    links.outcomes[key] = nil
                    links.rotations[key] = rotation
                    return links.stopped
                }
                if stopped { channel.close(promise: nil) }
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
                channel.closeFuture.whenComplete { _ in rotation.succeed() }
                try? await rotation.futureResult.get()
                let (rotated, outcome, lastLink, redial) = links.withLockedValue {
                    links -> (Bool, LinkOutcome?, Bool, Bool?) in
                    let rotated = links.channels[key].map { $0 !== channel } ?? true
                    if !rotated {
                        links.channels[key] = nil
                        links.rotations[key] = nil
                    }
                    return (
                        rotated, links.outcomes.removeValue(forKey: key), links.channels.isEmpty,
                        links.redial.removeValue(forKey: key)
                    )
                }
                recordLinks()
                if rotated { continue }  // dial again now, with the renewed certificate
                // The replica's grant stays while its links are down (`GatewayPolicy.Grants`): it may be the one that
                // made a narrowing the others have not heard of. It goes when the replica leaves the list.
                if lastLink { policy.connectionLost() }
                if self.stopped { break }
                switch outcome {
                case .refused(_, let code):
                    // A certificate replaced by a renewal made elsewhere: move to the new one at once.
                    if code == HostControlMessage.identityBlocked, let changed = keeper?.changedOnDisk(),
                        adopt(.changedOnDisk(changed))
                    {
                        keeper?.adopted(changed)
                        continue
                    }
                    let wait = backoff.refused(code: code)
                    logger.debug(
                        "link refused; waiting before the next try",
                        metadata: ["wait": "\(wait.nanoseconds / 1_000_000_000)s"]
                    )
                    try? await Task.sleep(nanoseconds: UInt64(wait.nanoseconds))
                    continue
                case .bound:
                    backoff.bound()
                    links.withLockedValue { $0.lastRefusal = nil }
                case nil:
                    break
                }
                if redial == true {
                    try? await Task.sleep(nanoseconds: UInt64.random(in: 10_000_000...50_000_000))
                    continue
                } else if redial == false {
                    try? await Task.sleep(nanoseconds: UInt64(duplicateBackoff.next().nanoseconds))
                    continue
                }
                duplicateBackoff.reset()
                logger.log(
                    level: slot == 0 ? .warning : .debug,
                    "lost the controller connection; reconnecting",
                    metadata: ["controller": "\(key.controller)"]
                )
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
            }
            try? await Task.sleep(nanoseconds: UInt64(backoff.failed().nanoseconds))
        }
        // A replica no longer listed whose last link is gone: its block list goes with it.
        let forget = links.withLockedValue { links in
            !links.listed.contains(key.controller) && !links.running.contains { $0.controller == key.controller }
                && !links.channels.keys.contains { $0.controller == key.controller }
        }
        if forget {
            policy.forgetRevoked(from: key.controller.description)
            logger.info(
                "no longer linking to a controller that left the list",
                metadata: ["controller": "\(key.controller)"]
            )
        }
    }

    /// After a renewal: every link is dialled again with the new certificate, and each old link closes once its
    /// circuits have ended.
    private func rotateLinks() {
        let old = links.withLockedValue { links -> [(any Channel, EventLoopPromise<Void>?)] in
            var old: [(any Channel, EventLoopPromise<Void>?)] = []
            for (key, channel) in links.channels {
                links.channels[key] = nil
                links.draining[ObjectIdentifier(channel)] = channel
                old.append((channel, links.rotations.removeValue(forKey: key)))
            }
            return old
        }
        for (channel, rotation) in old {
            let key = ObjectIdentifier(channel)
            channel.closeFuture.whenComplete { _ in
                _ = self.links.withLockedValue { $0.draining.removeValue(forKey: key) }
            }
            channel.triggerUserOutboundEvent(LinkDrainHandler.Drain(), promise: nil)
            rotation?.succeed()
        }
    }

    /// The controller refused link `slot`'s binding: logged once per distinct reason (a gateway that is refused
    /// retries for as long as it runs; the admin must see why, not a line every few minutes).
    private func refused(_ key: LinkKey, connection: any Channel, reason: String, code: String?) {
        let first = links.withLockedValue { links -> Bool in
            if links.channels[key] === connection { links.outcomes[key] = .refused(reason: reason, code: code) }
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
        let count = links.withLockedValue { $0.channels.count }
        GatewayMetrics.connected.record(count > 0 ? 1 : 0)
        GatewayMetrics.links.record(count)
    }

    /// The controller accepted link `key`'s binding, on relay loop `relayLoop` of `relayLoops`. A link on a loop
    /// another link to the same replica already has is dropped and dialled again (a few times, then kept); the
    /// first answer that names more loops than there are links starts the missing ones.
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
        links.withLockedValue { links in
            if links.channels[key] === connection { links.outcomes[key] = .bound }
        }
        let connectionID = ObjectIdentifier(connection)
        // A controller that does not say which loop: one link to it.
        let (duplicate, more) = links.withLockedValue { links -> (Bool, Bool) in
            let taken =
                relayLoop.map { loop in
                    links.relayLoops.contains {
                        $0.key.controller == key.controller && $0.key != key && $0.value.loop == loop
                    }
                } ?? false
            if taken {
                links.duplicates[key, default: 0] += 1
                links.redial[key] =
                    links.duplicates[key, default: 0] <= Self.quickRetriesPerLoop * max(relayLoops ?? 1, 2)
                return (true, false)
            }
            links.duplicates[key] = 0
            links.relayLoops[key] = (relayLoop ?? 0, connectionID)
            let wanted = min(relayLoops ?? 1, Self.maximumLinks)
            guard wanted > links.slots[key.controller, default: 1], !links.stopped else { return (false, false) }
            links.slots[key.controller] = wanted
            return (false, true)
        }
        if duplicate {
            connection.close(promise: nil)
            return
        }
        connection.closeFuture.whenComplete { _ in
            self.links.withLockedValue { links in
                if links.relayLoops[key]?.connection == connectionID { links.relayLoops[key] = nil }
            }
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
