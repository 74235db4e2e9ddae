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
public final class OverlayGateway: Service, Sendable {
    /// The identity in use: replaced when the certificate is renewed (new connections and circuits use it).
    private let identity:
        NIOLockedValueBox<
            (
                file: IdentityFile, connector: FabricConnector,
                credentials: E2EHandshake.Credentials
            )
        >
    /// Renews the certificate when due and notices one renewed in the identity file by someone else; `nil` without
    /// an identity file path (renewal is then left to `ils-gateway renew` and a restart).
    private let keeper: IdentityKeeper?
    private let service: String
    private let handshakeTimeout: TimeAmount
    private let keepalive: FabricKeepalive
    private let core: ProxyCore
    private let logger: Logger
    private let policy = GatewayPolicy()
    private let eventLoop: any EventLoop
    private let links = NIOLockedValueBox(Links())
    /// How many links the controller's relay can use, as learnt from it; `run` starts a connect loop for each.
    private let linkCount = AsyncStream.makeStream(of: Int.self)

    /// The gateway's connections to the controller ("links"). The controller's relay runs several event loops and
    /// splices each circuit onto a gateway connection on the device connection's own loop when there is one, so
    /// the gateway keeps one link per relay loop (it is told, on each link, which loop it landed on). Every link
    /// carries the control stream and circuits alike; the gateway is hosting while any of them is up.
    private struct Links {
        /// Live links, by slot.
        var channels: [Int: any Channel] = [:]
        /// The relay loop of each bound link, by slot.
        var relayLoops: [Int: (loop: Int, connection: ObjectIdentifier)] = [:]
        /// Consecutive times a slot landed on a loop another link already had.
        var duplicates: [Int: Int] = [:]
        /// Slots whose link was closed for landing on a taken loop: they dial again, at once (`true`) or after the
        /// usual backoff.
        var redial: [Int: Bool] = [:]
        var slots = 1
        var stopped = false
        /// How each slot's current link ended its binding: accepted, or refused with the controller's reason.
        var outcomes: [Int: LinkOutcome] = [:]
        /// Completed to make a slot link again at once (after a renewal) while its old link drains.
        var rotations: [Int: EventLoopPromise<Void>] = [:]
        /// Links replaced after a renewal, finishing their circuits.
        var draining: [ObjectIdentifier: any Channel] = [:]
        /// The last refusal logged, so a refused gateway says why once, not at every retry.
        var lastRefusal: String?
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
        keepalive: FabricKeepalive = .standard
    ) throws(ILSError) {
        guard identity.identity.role == .gateway else {
            throw ILSError(
                .permissionDenied,
                "identity '\(identity.identity.name)' has role \(identity.identity.role.rawValue); serving needs a gateway identity"
            )
        }
        self.identity = NIOLockedValueBox(try Self.load(identity))
        self.keeper = identityPath.map { IdentityKeeper(path: $0, current: identity) }
        self.service = service
        self.handshakeTimeout = handshakeTimeout
        self.keepalive = keepalive
        // One event loop carries the controller connection, its circuits and their backend connections, so a
        // circuit and its backend request never hop threads.
        self.eventLoop = MultiThreadedEventLoopGroup.singleton.next()
        // All backend connections live on that one loop, so it gets the whole `--backend-max-connections`: split
        // between the machine's cores, half of it would answer 503 beyond ~8,000 concurrent streams.
        self.core = ProxyCore(configuration: proxy, logger: logger, loopCount: 1)
        self.logger = logger
    }

    private static func load(_ file: IdentityFile) throws(ILSError) -> (
        file: IdentityFile, connector: FabricConnector, credentials: E2EHandshake.Credentials
    ) {
        (
            file,
            try FabricConnector(identity: file, alpn: FabricProtocol.hostALPN),
            try E2EHandshake.Credentials(
                certificatePEM: file.certificate,
                privateKeyPEM: file.privateKey,
                caCertificatePEM: file.caCertificate
            )
        )
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
        rotateLinks()
        return true
    }

    public func run() async throws {
        await withGracefulShutdownHandler {
            await withDiscardingTaskGroup { group in
                if let keeper = self.keeper {
                    group.addTask { await keeper.run { self.adopt($0) } }
                }
                group.addTask { await self.connectLoop(slot: 0) }
                var started = 1
                for await wanted in self.linkCount.stream {
                    while started < wanted {
                        let slot = started
                        group.addTask { await self.connectLoop(slot: slot) }
                        started += 1
                    }
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
        linkCount.continuation.finish()
        for channel in channels { channel.close(promise: nil) }
    }

    /// Whether the gateway's own block list holds this identity (revoked or disabled).
    public func blocks(identityID: String) -> Bool { policy.blocks(identityID) }

    /// Whether the gateway is connected and has its policy from the controller (for tests and readiness).
    public var isHosting: Bool { links.withLockedValue { !$0.channels.isEmpty } && policy.isKnown }

    /// How many of the controller's relay loops this gateway has a bound link on (for tests).
    public var relayLoopsCovered: Int { links.withLockedValue { Set($0.relayLoops.values.map(\.loop)).count } }

    private var stopped: Bool { links.withLockedValue { $0.stopped } }

    /// Keeps link `slot` up: dials, waits for it to close, dials again with jittered backoff. Slot 0 reports to the
    /// log at info; the others, which come and go with it, at debug.
    /// Waits between tries as `LinkBackoff` says.
    private func connectLoop(slot: Int) async {
        var backoff = LinkBackoff()
        // Links that landed on a relay loop another link has: not reset by each connection, unlike `backoff`, and
        // slower, since the controller is up and the link is only redundant.
        var duplicateBackoff = Backoff(maximum: .seconds(3))
        var lastFailure: String?
        let level: Logger.Level = slot == 0 ? .info : .debug
        while !stopped {
            do {
                let channel = try await connect(slot: slot).get()
                let rotation = channel.eventLoop.makePromise(of: Void.self)
                let stopped = links.withLockedValue { links -> Bool in
                    links.channels[slot] = channel
                    links.outcomes[slot] = nil
                    links.rotations[slot] = rotation
                    return links.stopped
                }
                if stopped { channel.close(promise: nil) }
                lastFailure = nil
                logger.log(
                    level: level,
                    "connected to controller",
                    metadata: [
                        "controller": "\(identity.withLockedValue { $0.connector.address })",
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
                    let rotated = links.channels[slot].map { $0 !== channel } ?? true
                    if !rotated {
                        links.channels[slot] = nil
                        links.rotations[slot] = nil
                    }
                    return (
                        rotated, links.outcomes.removeValue(forKey: slot), links.channels.isEmpty,
                        links.redial.removeValue(forKey: slot)
                    )
                }
                recordLinks()
                if rotated { continue }  // dial again now, with the renewed certificate
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
                logger.log(level: slot == 0 ? .warning : .debug, "lost the controller connection; reconnecting")
            } catch {
                let description = (error as? ILSError)?.reason ?? "\(error)"
                if description != lastFailure, slot == 0 {
                    logger.warning(
                        "cannot reach the controller; retrying with backoff",
                        metadata: [
                            "controller": "\(identity.withLockedValue { $0.connector.address })",
                            "error": "\(description)",
                        ]
                    )
                    lastFailure = description
                } else {
                    logger.debug(
                        "controller still unreachable",
                        metadata: ["error": "\(description)", "link": "\(slot)"]
                    )
                }
            }
            try? await Task.sleep(nanoseconds: UInt64(backoff.failed().nanoseconds))
        }
    }

    /// After a renewal: every link is dialled again with the new certificate, and each old link closes once its
    /// circuits have ended.
    private func rotateLinks() {
        let old = links.withLockedValue { links -> [(any Channel, EventLoopPromise<Void>?)] in
            var old: [(any Channel, EventLoopPromise<Void>?)] = []
            for (slot, channel) in links.channels {
                links.channels[slot] = nil
                links.draining[ObjectIdentifier(channel)] = channel
                old.append((channel, links.rotations.removeValue(forKey: slot)))
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
    private func refused(slot: Int, connection: any Channel, reason: String, code: String?) {
        let first = links.withLockedValue { links -> Bool in
            if links.channels[slot] === connection { links.outcomes[slot] = .refused(reason: reason, code: code) }
            defer { links.lastRefusal = reason }
            return links.lastRefusal != reason
        }
        let permanent = code == HostControlMessage.identityBlocked
        logger.log(
            level: first ? .error : .debug,
            permanent
                ? "the controller refused this gateway's identity; retrying every few minutes"
                : "the controller refused to let this gateway host the service",
            metadata: ["reason": "\(reason)", "service": "\(service)"]
        )
    }

    private func recordLinks() {
        let count = links.withLockedValue { $0.channels.count }
        GatewayMetrics.connected.record(count > 0 ? 1 : 0)
        GatewayMetrics.links.record(count)
    }

    /// The controller accepted link `slot`'s binding, on relay loop `relayLoop` of `relayLoops`. A link on a loop
    /// another link already has is dropped and dialled again (a few times, then kept); the first answer that
    /// names more loops than there are links starts the missing ones.
    private func bound(slot: Int, connection: any Channel, relayLoop: Int?, relayLoops: Int?) {
        logger.log(
            level: slot == 0 ? .info : .debug,
            "hosting service",
            metadata: [
                "service": "\(service)", "link": "\(slot)", "relay_loop": "\(relayLoop.map(String.init) ?? "-")",
            ]
        )
        links.withLockedValue { links in
            if links.channels[slot] === connection { links.outcomes[slot] = .bound }
        }
        guard let relayLoop, let relayLoops else { return }  // a controller that does not say: one link
        let key = ObjectIdentifier(connection)
        let (duplicate, wanted) = links.withLockedValue { links -> (Bool, Int?) in
            let taken = links.relayLoops.contains { $0.key != slot && $0.value.loop == relayLoop }
            if taken {
                links.duplicates[slot, default: 0] += 1
                links.redial[slot] = links.duplicates[slot]! <= Self.quickRetriesPerLoop * max(relayLoops, 2)
                return (true, nil)
            }
            links.duplicates[slot] = 0
            links.relayLoops[slot] = (relayLoop, key)
            let wanted = min(relayLoops, Self.maximumLinks)
            guard wanted > links.slots, !links.stopped else { return (false, nil) }
            links.slots = wanted
            return (false, wanted)
        }
        if duplicate {
            connection.close(promise: nil)
            return
        }
        connection.closeFuture.whenComplete { _ in
            self.links.withLockedValue { links in
                if links.relayLoops[slot]?.connection == key { links.relayLoops[slot] = nil }
            }
        }
        if let wanted { linkCount.continuation.yield(wanted) }
    }

    private func connect(slot: Int) -> EventLoopFuture<any Channel> {
        let (connector, credentials) = identity.withLockedValue { ($0.connector, $0.credentials) }
        var settings = GatewayStreamRouter.Context(
            service: service,
            credentials: credentials,
            policy: policy,
            core: core,
            logger: logger,
            onRefusal: { [weak self] connection, reason, code in
                guard let connection else { return }
                self?.refused(slot: slot, connection: connection, reason: reason, code: code)
            }
        )
        settings.handshakeTimeout = handshakeTimeout
        settings.onBound = { [weak self] connection, relayLoop, relayLoops in
            self?.bound(slot: slot, connection: connection, relayLoop: relayLoop, relayLoops: relayLoops)
        }
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
                        metadata: ["link": "\(slot)", "timeout": "\(keepalive.timeout)"]
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
