import ILSCore
import ILSFabric
import Logging
import NIOConcurrencyHelpers
import NIOCore
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
final class PolicyLink: Sendable {
    private enum Outcome {
        case bound
        case refused(reason: String, code: String?)
    }

    private struct State {
        var channel: (any Channel)?
        var outcome: Outcome?
        var stopped = false
        var graceTimer: Scheduled<Void>?
        var lastProblem: String?
    }

    private let connector: FabricConnector
    private let service: String
    private let policy: GatewayPolicy
    private let grace: TimeAmount
    private let keepalive: FabricKeepalive
    private let logger: Logger
    private let eventLoop: any EventLoop
    private let state = NIOLockedValueBox(State())

    init(
        identity: IdentityFile,
        service: String,
        policy: GatewayPolicy,
        grace: TimeAmount,
        keepalive: FabricKeepalive = .standard,
        logger: Logger
    ) throws(ILSError) {
        guard identity.identity.role == .gateway else {
            throw ILSError(
                .permissionDenied,
                "identity '\(identity.identity.name)' has role \(identity.identity.role.rawValue); HTTP mode with "
                    + "client certificates needs a gateway identity"
            )
        }
        self.connector = try FabricConnector(identity: identity, alpn: FabricProtocol.hostALPN)
        self.service = service
        self.policy = policy
        self.grace = grace
        self.keepalive = keepalive
        self.logger = logger
        self.eventLoop = MultiThreadedEventLoopGroup.singleton.next()
    }

    /// Whether the controller's policy is in force now (for readiness and tests).
    var hasPolicy: Bool { policy.isKnown }

    private var stopped: Bool { state.withLockedValue { $0.stopped } }

    /// Keeps the link up until `stop`.
    func run() async {
        var backoff = Backoff()
        var identityRefusalBackoff = Backoff(initial: .seconds(30), maximum: .seconds(300))
        var serviceRefusalBackoff = Backoff(initial: .seconds(5), maximum: .seconds(60))
        while !stopped {
            do {
                let channel = try await connect().get()
                let stopped = state.withLockedValue { state -> Bool in
                    state.channel = channel
                    state.outcome = nil
                    return state.stopped
                }
                if stopped { channel.close(promise: nil) }
                try? await channel.closeFuture.get()
                let outcome = state.withLockedValue { state -> Outcome? in
                    state.channel = nil
                    return state.outcome
                }
                GatewayMetrics.connected.record(0)
                linkLost()
                if self.stopped { break }
                switch outcome {
                case .bound:
                    backoff.reset()
                    identityRefusalBackoff.reset()
                    serviceRefusalBackoff.reset()
                    logger.warning("lost the controller connection (policy link); reconnecting")
                case .refused(_, let code):
                    let wait =
                        code == HostControlMessage.identityBlocked
                        ? identityRefusalBackoff.next() : serviceRefusalBackoff.next()
                    try? await Task.sleep(nanoseconds: UInt64(wait.nanoseconds))
                    continue
                case nil:
                    break
                }
            } catch {
                report("cannot reach the controller; retrying with backoff", (error as? ILSError)?.reason ?? "\(error)")
            }
            try? await Task.sleep(nanoseconds: UInt64(backoff.next().nanoseconds))
        }
    }

    /// Stops reconnecting and closes the link.
    func stop() {
        let (channel, timer) = state.withLockedValue { state in
            state.stopped = true
            return (state.channel, state.graceTimer)
        }
        timer?.cancel()
        channel?.close(promise: nil)
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

    private func apply(_ message: HostControlMessage, connection: (any Channel)?) {
        if let blocked = message.blocked {
            policy.updateRevoked(blocked)
        }
        if let roles = message.dialRoles {
            policy.update(roles)
            let timer = state.withLockedValue { state in
                defer {
                    state.graceTimer = nil
                    state.outcome = .bound
                    state.lastProblem = nil
                }
                return state.graceTimer
            }
            timer?.cancel()
            GatewayMetrics.connected.record(1)
            logger.info(
                "policy link up: the controller's policy and revocations apply",
                metadata: ["controller": "\(connector.address)", "service": "\(service)"]
            )
        } else if let error = message.error {
            state.withLockedValue { $0.outcome = .refused(reason: error, code: message.errorCode) }
            report("the controller refused the policy link", error)
            connection?.close(promise: nil)
        }
    }

    private func connect() -> EventLoopFuture<any Channel> {
        let service = self.service
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
                PolicyLinkRouter(service: service) { message, connection in
                    link?.apply(message, connection: connection)
                }
            }
            try channel.pipeline.syncOperations.addHandler(
                FabricConnectionErrorHandler { error in
                    logger.warning("policy link failed; reconnecting", metadata: ["error": "\(error)"])
                }
            )
        }
    }
}
