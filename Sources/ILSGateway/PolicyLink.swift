import Foundation
import ILSCore
import ILSCrypto
import ILSFabric
import ILSIdentity
import Logging
import NIOConcurrencyHelpers
import NIOCore
import NIOHTTP2
import NIOPosix

/// HTTP mode's control link: one mTLS connection to the controller with the gateway's own identity (`ils-host/1`,
/// as an overlay gateway's), over which the controller sends the service's dial policy and every change to the
/// block list. It asks for policy only (`ils-link: policy`): the controller never routes a circuit to it.
///
/// The link is kept up across controller restarts: it is dialled again with jittered backoff (100 ms doubling to
/// 800 ms) after a link that was bound drops; a refusal waits longer (the identity's own: 30 s doubling to 5 min;
/// the service's: 5 s doubling to 1 min) and its reason is logged once.
///
/// While the link is down the gateway keeps the block list (a revoked device stays out) and keeps the dial policy
/// for `grace`, then forgets it, so every request is refused with 503 `policy_unavailable` until the link is back.
/// Unlike the overlay gateway, which forgets the dial policy at once (it gets no circuit without the controller
/// anyway), an HTTP-mode gateway serves on its own: forgetting at once would make every controller restart an
/// outage, and never forgetting would let a device revoked during a long outage in indefinitely. The grace is the
/// bound on how late such a revocation can take effect here.
///
/// Each client's certificate is also checked with the controller when it connects (`check`): a deleted identity, or
/// a certificate replaced by `renew` or `reissue`, is in no block list, but the controller's store knows. While the
/// link is down the local decision (block list and dial policy) stands alone; a controller that is linked but does
/// not answer within `checkTimeout` gets the client refused for now (503), not admitted unchecked: a slow
/// controller must not open the door that a reachable one would keep shut.
final class PolicyLink: Sendable {
    /// What the controller said about a client's certificate.
    enum CheckResult: Sendable, Equatable {
        /// The certificate is its identity's current one and the identity active; `dial` is whether the service's
        /// dial policy allows it as the controller's directory holds it now (`nil` from a controller before that).
        case allowed(dial: Bool?)
        case refused(reason: String)
        /// No link to ask over: the local decision stands.
        case unavailable
        /// Asked, but no answer within `checkTimeout`.
        case noAnswer
    }

    /// How long a client's connection waits for the controller's answer before the local decision stands alone.
    static let checkTimeout: TimeAmount = .seconds(5)

    private struct State {
        /// The link's lifecycle (`LinkMachine`, as each of the overlay gateway's links).
        var machine = LinkMachine()
        /// The connection of `machine`'s link, while it is up.
        var channel: (any Channel)?
        /// The control stream of the link's connection, on which certificate checks go (while it is bound).
        var control: (any Channel)?
        var graceTimer: Scheduled<Void>?
        var lastProblem: String?
        var nextCheck = 0
        /// Unanswered checks: the promise, and the identity asked about.
        var checks: [Int: (promise: EventLoopPromise<CheckResult>, identityID: String)] = [:]
        /// Open client connections by the fingerprint of the certificate they were admitted with.
        var admitted: [String: (peer: IdentityCertificate, channels: [ObjectIdentifier: any Channel])] = [:]
    }

    /// The identity in use and its connector: replaced when the certificate is renewed.
    private let identity: NIOLockedValueBox<(file: IdentityFile, connector: FabricConnector)>
    /// Renews the certificate when due and notices one renewed in the identity file by someone else; `nil` without
    /// an identity file path (renewal is then left to `ils-gateway renew` and a restart).
    private let keeper: IdentityKeeper?
    private let recheckInterval: Duration
    private var connector: FabricConnector { identity.withLockedValue { $0.connector } }
    private let service: String
    private let policy: GatewayPolicy
    private let grace: TimeAmount
    private let keepalive: FabricKeepalive
    private let logger: Logger
    private let eventLoop: any EventLoop
    private let state = NIOLockedValueBox(State())
    /// The key of this link's controller in `GatewayPolicy` (its grant and block list): empty for the identity file's
    /// controller (the primary link, which also checks certificates and renews), the address for the others.
    private let key: String
    /// A link to another controller of the cluster, for its grant and block list only (`Secondaries`).
    private let isSecondary: Bool
    /// The primary's links to the other controllers the cluster lists, by address; none once stopped.
    private struct Secondaries {
        var links: [ControllerAddress: (link: PolicyLink, task: Task<Void, Never>)] = [:]
        var stopped = false
    }
    private let secondaries = NIOLockedValueBox(Secondaries())

    init(
        identity: IdentityFile,
        service: String,
        policy: GatewayPolicy,
        identityPath: String? = nil,
        renewalCheck: Duration = .seconds(6 * 3600),
        recheckInterval: Duration = .seconds(60),
        now: @escaping @Sendable () -> Date = { Date() },
        grace: TimeAmount,
        keepalive: FabricKeepalive = .standard,
        logger: Logger,
        secondaryAddress: ControllerAddress? = nil
    ) throws(ILSError) {
        guard identity.identity.role == .gateway else {
            throw ILSError(
                .permissionDenied,
                "identity '\(identity.identity.name)' has role \(identity.identity.role.rawValue); HTTP mode with "
                    + "client certificates needs a gateway identity"
            )
        }
        self.identity = NIOLockedValueBox(
            (identity, try Self.connector(identity, secondaryAddress))
        )
        self.key = secondaryAddress?.description ?? ""
        self.isSecondary = secondaryAddress != nil
        self.keeper =
            secondaryAddress == nil
            ? identityPath.map { IdentityKeeper(path: $0, current: identity, renewalCheck: renewalCheck, now: now) }
            : nil
        self.recheckInterval = recheckInterval
        self.service = service
        self.policy = policy
        self.grace = grace
        self.keepalive = keepalive
        self.logger = logger
        self.eventLoop = MultiThreadedEventLoopGroup.singleton.next()
    }

    /// The certificate the link dials with now.
    var certificate: String { identity.withLockedValue { $0.file.certificate } }

    /// Whether the controller's policy is in force now (for readiness and tests).
    var hasPolicy: Bool { policy.isKnown }

    /// Whether the link is up and bound, so a client's certificate is checked with the controller (tests).
    var isBound: Bool { boundCertificate != nil }

    /// The certificate of the link that is up and bound now, if one is (tests: a renewal's new link is bound).
    var boundCertificate: String? {
        state.withLockedValue { state in
            guard state.control != nil else { return nil }
            return state.machine.bound?.certificate
        }
    }

    private var stopped: Bool { state.withLockedValue { $0.machine.isStopped } }

    private static func connector(_ identity: IdentityFile, _ address: ControllerAddress?) throws(ILSError)
        -> FabricConnector
    {
        guard let address else { return try FabricConnector(identity: identity, alpn: FabricProtocol.hostALPN) }
        return try FabricConnector(identity: identity, alpn: FabricProtocol.hostALPN, address: address)
    }

    /// The controllers this gateway has a policy link to now: the primary's and those of its secondary links (tests).
    var linkedControllers: [String] {
        [connector.address.description] + secondaries.withLockedValue { $0.links.keys.map(\.description) }.sorted()
    }

    /// Whether this link is up and bound to its controller, and every secondary link too (tests).
    var allBound: Bool {
        isBound && secondaries.withLockedValue { Array($0.links.values) }.allSatisfy { $0.link.isBound }
    }

    /// Keeps the link up until `stop`, and the gateway's certificate renewed.
    func run() async {
        // Cancelled, the link stops (as `OverlayGateway.run`): its loop's sleeps would otherwise return at once.
        await withTaskCancellationHandler {
            if isSecondary {
                await connectLoop()
                return
            }
            await withDiscardingTaskGroup { group in
                if let keeper = self.keeper {
                    group.addTask { await keeper.run { self.adopt($0) } }
                }
                group.addTask { await self.recheckLoop() }
                await connectLoop()
                group.cancelAll()
            }
        } onCancel: {
            self.stop()
        }
    }

    /// Remembers a client connection admitted with `peer`'s certificate, for `recheckLoop`, until it closes.
    func admitted(_ channel: any Channel, peer: IdentityCertificate) {
        let key = ObjectIdentifier(channel)
        state.withLockedValue { state in
            state.admitted[peer.fingerprint, default: (peer, [:])].channels[key] = channel
        }
        channel.closeFuture.whenComplete { [state] _ in
            state.withLockedValue { state in
                state.admitted[peer.fingerprint]?.channels[key] = nil
                if state.admitted[peer.fingerprint]?.channels.isEmpty == true {
                    state.admitted[peer.fingerprint] = nil
                }
            }
        }
    }

    /// Every `recheckInterval` (60 s), asks the controller again about each certificate with open connections, and
    /// closes those it refuses. Revocations and disables are pushed and cut at once; a deletion or a certificate
    /// replaced by `renew` or `reissue` is not pushed, so this bounds how long such a certificate's open connections
    /// (a stream, a keep-alive connection) outlive it.
    private func recheckLoop() async {
        while !stopped {
            do {
                try await Task.sleep(for: recheckInterval)
            } catch {
                return
            }
            let open = state.withLockedValue { Array($0.admitted.values) }
            for (peer, channels) in open {
                guard let loop = channels.values.first?.eventLoop, let result = try? await check(peer, on: loop).get()
                else { continue }
                let reason: String
                switch result {
                case .refused(let refusal): reason = refusal
                // A narrowing ends these connections through the grant that carries it; this catches one whose grant
                // this gateway never got.
                case .allowed(dial: false): reason = "the service's dial policy no longer allows it"
                case .allowed, .unavailable, .noAnswer: continue
                }
                logger.notice(
                    "closing connections of a certificate the controller no longer accepts",
                    metadata: ["identity": "\(peer.name)", "reason": "\(reason)", "connections": "\(channels.count)"]
                )
                for channel in channels.values { channel.close(promise: nil) }
            }
        }
    }

    /// Moves the link to a renewed certificate (renewed here when due, 30 days before it expires, or by someone else
    /// in the identity file): without it the link would be refused once the certificate was replaced or expired, and
    /// after the grace every request would be refused. The link carries no client traffic, so re-linking cuts nothing;
    /// clients' certificates are checked against the CA, which renewal does not change. Returns whether the
    /// certificate could be used.
    private func adopt(_ change: IdentityKeeper.Change) -> Bool {
        let renewed: IdentityFile
        switch change {
        case .renewed(let file), .changedOnDisk(let file):
            renewed = file
        case .renewalFailed(let error):
            logger.warning("certificate renewal failed; will retry", metadata: ["error": "\(error.reason)"])
            return false
        }
        do {
            let connector = try FabricConnector(identity: renewed, alpn: FabricProtocol.hostALPN)
            identity.withLockedValue { $0 = (renewed, connector) }
        } catch {
            logger.warning("the new certificate cannot be used", metadata: ["error": "\(error.reason)"])
            return false
        }
        logger.info(
            "certificate renewed; re-linking with it",
            metadata: ["until": "\(renewed.identity.certificateNotAfter ?? 0)"]
        )
        rotate()
        // Under the lock `controllersListed` makes links under, after the identity changed: a link it makes now reads
        // the renewed file, one it made before gets it here.
        secondaries.withLockedValue { all in
            for (address, secondary) in all.links { secondary.link.use(renewed, address: address) }
        }
        return true
    }

    /// A secondary link moves to the primary's renewed certificate: it links again with it.
    private func use(_ file: IdentityFile, address: ControllerAddress) {
        guard let connector = try? Self.connector(file, address) else { return }
        identity.withLockedValue { $0 = (file, connector) }
        rotate()
    }

    /// After a renewal: the link in use closes (it carries no client traffic), and the connect loop dials again at
    /// once with the new certificate; a dial in progress is replaced once it connects.
    private func rotate() {
        state.withLockedValue { state -> (any Channel)? in
            state.machine.rotate() != nil ? state.channel : nil
        }?.close(promise: nil)
    }

    /// The controller list the primary's controller sent: a link to each other controller, for its grant and block
    /// list (`GatewayPolicy` admits only an identity every linked controller's grant holds, so a narrowing made
    /// through another controller applies here even when the primary's controller has not heard of it: its store
    /// feed stalled). A controller that left the list loses its link, and its grant and block list with it.
    private func controllersListed(_ list: [String]) {
        let own = connector.address
        let wanted = Set(ControllerAddress.replicas(list).filter { $0 != own })
        var file = identity.withLockedValue { $0.file }
        var started: [(ControllerAddress, PolicyLink)] = []
        let gone = secondaries.withLockedValue { all -> [(ControllerAddress, PolicyLink, Task<Void, Never>)] in
            // After `stop` (a message read while it ran), no link is started that nothing would stop.
            guard !all.stopped else { return [] }
            // Read under this lock, which `adopt` takes after a renewal: a new link never keeps the old certificate.
            file = identity.withLockedValue { $0.file }
            let gone = all.links.filter { !wanted.contains($0.key) }.map { ($0.key, $0.value.link, $0.value.task) }
            for (address, _, _) in gone { all.links[address] = nil }
            for address in wanted where all.links[address] == nil {
                guard
                    let link = try? PolicyLink(
                        identity: file,
                        service: service,
                        policy: policy,
                        recheckInterval: recheckInterval,
                        grace: grace,
                        keepalive: keepalive,
                        logger: logger,
                        secondaryAddress: address
                    )
                else { continue }
                all.links[address] = (link, Task { await link.run() })
                started.append((address, link))
            }
            return gone
        }
        for (address, link, task) in gone {
            link.stop()
            task.cancel()
            policy.forgetRevoked(from: address.description)
        }
        if let path = keeper?.path, !started.isEmpty || !gone.isEmpty {
            // Kept in the identity file too, off the link's event loop (a file write and fsync).
            IdentityFileIO.learnInBackground(
                ControllerAddress.replicas(list),
                path: path,
                certificate: file.certificate
            )
        }
        if !started.isEmpty || !gone.isEmpty {
            logger.info(
                "policy links to the cluster's other controllers",
                metadata: ["controllers": "\(wanted.map(\.description).sorted())"]
            )
        }
    }

    private func connectLoop() async {
        while state.withLockedValue({ [certificate] in $0.machine.dial(certificate: certificate) }) {
            let next: LinkMachine.Next
            do {
                let channel = try await connect().get()
                switch state.withLockedValue({ $0.machine.connected(ObjectIdentifier(channel)) }) {
                case .keep: state.withLockedValue { $0.channel = channel }
                case .close, .replace:
                    channel.close(promise: nil)
                    continue
                }
                try? await channel.closeFuture.get()
                let (ended, unanswered) = state.withLockedValue {
                    state -> (LinkMachine.Next, [EventLoopPromise<CheckResult>]) in
                    if state.channel === channel { state.channel = nil }
                    state.control = nil
                    defer { state.checks = [:] }
                    return (state.machine.ended(ObjectIdentifier(channel)), state.checks.values.map(\.promise))
                }
                for promise in unanswered { promise.succeed(.unavailable) }
                if !isSecondary { GatewayMetrics.connected.record(0) }
                linkLost()
                next = ended
            } catch {
                report("cannot reach the controller; retrying with backoff", (error as? ILSError)?.reason ?? "\(error)")
                next = state.withLockedValue { $0.machine.dialFailed() }
            }
            guard case .dial(let wait, let because) = next else { break }
            switch because {
            case .refused(let code):
                // A certificate replaced by a renewal made elsewhere: move to the new one at once.
                if keeper?.movedOn(afterRefusal: code, adopt: adopt) == true { continue }
            case .lost(wasBound: true):
                logger.warning("lost the controller connection (policy link); reconnecting")
            case .lost(wasBound: false), .rotated, .duplicate, .failed:
                break
            }
            if wait > .zero { try? await Task.sleep(nanoseconds: UInt64(wait.nanoseconds)) }
        }
    }

    /// The link starts a dial, as its connect loop does (tests that play the controller's side on a stream of their
    /// own, whose answers then bind it).
    func dialling() {
        state.withLockedValue { [certificate] in _ = $0.machine.dial(certificate: certificate) }
    }

    /// Stops reconnecting and closes the link.
    func stop() {
        let (channel, timer) = state.withLockedValue { state in
            _ = state.machine.stop()
            return (state.channel, state.graceTimer)
        }
        timer?.cancel()
        channel?.close(promise: nil)
        let links = secondaries.withLockedValue { all in
            defer {
                all.links = [:]
                all.stopped = true
            }
            return Array(all.links.values)
        }
        for secondary in links {
            secondary.link.stop()
            secondary.task.cancel()
        }
    }

    /// Asks the controller whether `peer`'s certificate is its identity's current one and the identity active. The
    /// future completes on `eventLoop`, with `.unavailable` at once when the link is not bound.
    func check(_ peer: IdentityCertificate, on eventLoop: any EventLoop) -> EventLoopFuture<CheckResult> {
        let promise = eventLoop.makePromise(of: CheckResult.self)
        let asked = state.withLockedValue { state -> (Int, any Channel)? in
            guard let control = state.control, state.machine.bound != nil else { return nil }
            state.nextCheck += 1
            state.checks[state.nextCheck] = (promise, peer.id)
            return (state.nextCheck, control)
        }
        guard let (number, control) = asked,
            var line = try? JSONEncoder().encode(
                CertificateCheck(check: number, id: peer.id, fingerprint: peer.fingerprint)
            )
        else {
            promise.succeed(.unavailable)
            return promise.futureResult
        }
        line.append(UInt8(ascii: "\n"))
        let timeout = eventLoop.scheduleTask(in: Self.checkTimeout) { [state] in
            state.withLockedValue { $0.checks.removeValue(forKey: number) }?.promise.succeed(.noAnswer)
        }
        promise.futureResult.whenComplete { _ in timeout.cancel() }
        control.writeAndFlush(
            HTTP2Frame.FramePayload.data(.init(data: .byteBuffer(ByteBuffer(bytes: line)))),
            promise: nil
        )
        return promise.futureResult
    }

    /// Called on the link's event loop, in the control stream's order. An identity the controller says may dial
    /// joins the grant in force here, before any grant that follows the answer on the stream is applied: done later,
    /// on the client connection's loop, it could undo a narrowing that arrived meanwhile.
    private func answer(_ verdict: CertificateVerdict) {
        guard let (promise, identityID) = state.withLockedValue({ $0.checks.removeValue(forKey: verdict.verdict) })
        else { return }
        if verdict.allowed, verdict.dial == true { policy.admitFromVerdict(identityID, from: key) }
        promise.succeed(
            verdict.allowed
                ? .allowed(dial: verdict.dial)
                : .refused(reason: verdict.reason ?? "this identity certificate is not valid")
        )
    }

    /// Logs a problem at warning once, until it changes or the link is bound again.
    private func report(_ message: Logger.Message, _ problem: String) {
        let isNew = state.withLockedValue { state -> Bool in
            defer { state.lastProblem = problem }
            return state.lastProblem != problem
        }
        if isNew {
            logger.warning(message, metadata: ["controller": "\(connector.address)", "error": "\(problem)"])
        } else {
            logger.debug(message, metadata: ["error": "\(problem)"])
        }
    }

    /// The link is gone: the dial policy stays in force for `grace`, unless the link is bound again before.
    private func linkLost() {
        // A secondary link's controller keeps its grant and blocks while it is unreachable (it may be the one that
        // made a narrowing the others have not heard of); they go when it leaves the controller list.
        if isSecondary { return }
        guard !stopped, policy.isKnown else { return }
        let grace = self.grace
        let timer = eventLoop.scheduleTask(in: grace) { [policy, logger] in
            policy.connectionLost()
            logger.warning(
                "no policy from the controller within the grace; refusing every request until the policy link is back",
                metadata: ["grace": "\(TimeSpan(nanoseconds: grace.nanoseconds))"]
            )
        }
        let previous = state.withLockedValue { state in
            defer { state.graceTimer = timer }
            return state.graceTimer
        }
        previous?.cancel()
    }

    private func apply(_ message: HostControlMessage, connection: any Channel) {
        // A link that was stopped (a secondary whose controller left the list) applies nothing more: a message read
        // while it closed would put back the grant and blocks `forgetRevoked` just dropped.
        guard !stopped else { return }
        if let blocked = message.blocked {
            policy.updateRevoked(blocked, from: key)
        }
        if let list = message.controllers, !isSecondary {
            controllersListed(list)
        }
        if let grant = message.dialGrant, !policy.updateGrant(grant, from: key, hosted: service) {
            logger.warning(
                "the controller sent a dial grant this gateway cannot apply; the previous one stays in force"
            )
        }
        if let roles = message.dialRoles {
            // The dial roles, and with them whether the gateway has a policy at all, are the primary's: a secondary
            // link must not bring the policy back once the primary's grace ran out (certificate checks would then go
            // unasked with no bound).
            if !isSecondary { policy.update(roles) }
            let timer = state.withLockedValue { state in
                defer {
                    state.graceTimer = nil
                    _ = state.machine.accepted(ObjectIdentifier(connection))
                    state.lastProblem = nil
                }
                return state.graceTimer
            }
            timer?.cancel()
            if !isSecondary { GatewayMetrics.connected.record(1) }
            logger.info(
                "policy link up: the controller's policy and revocations apply",
                metadata: ["controller": "\(connector.address)", "service": "\(service)"]
            )
        } else if let error = message.error {
            state.withLockedValue {
                _ = $0.machine.refused(ObjectIdentifier(connection), reason: error, code: message.errorCode)
            }
            report("the controller refused the policy link", error)
            connection.close(promise: nil)
        }
    }

    /// The handler of each stream the controller opens on a link, wired to this link (weakly: a link that is gone
    /// leaves its streams nothing to do).
    func router() -> PolicyLinkRouter {
        PolicyLinkRouter(
            service: service,
            events: .init(
                onControlStream: { [weak self] stream, connection in
                    self?.state.withLockedValue { state in
                        // The stream of this link's connection only (a renewal's old link may still be closing).
                        if state.machine.accepts(ObjectIdentifier(connection)) { state.control = stream }
                    }
                },
                onMessage: { [weak self] message, connection in self?.apply(message, connection: connection) },
                onVerdict: { [weak self] verdict in self?.answer(verdict) }
            )
        )
    }

    private func connect() -> EventLoopFuture<any Channel> {
        let keepalive = self.keepalive
        let logger = self.logger
        return connector.connect(on: eventLoop) { [weak self] channel in
            let link = self
            try channel.pipeline.syncOperations.configureFabricHTTP2(
                mode: .server,
                keepalive: KeepaliveHandler(keepalive) {
                    logger.warning("the controller stopped answering keepalives; reconnecting the policy link")
                }
            ) {
                guard let link else { return PolicyLinkRouter(service: "", events: .ignoring) }
                return link.router()
            }
            try channel.pipeline.syncOperations.addHandler(
                FabricConnectionErrorHandler { error in
                    logger.warning("policy link failed; reconnecting", metadata: ["error": "\(error)"])
                }
            )
        }
    }
}
