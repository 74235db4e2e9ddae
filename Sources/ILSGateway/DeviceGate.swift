import Foundation
import ILSCore
import ILSCrypto
import ILSProxy
import Logging
import NIOCore
import NIOSSL
import NIOTLS

/// HTTP mode with client certificates: waits for the TLS handshake, decides on the verified certificate, and only
/// then sets up the rest of the connection, either the proxy (with the identity the backend will see) or a
/// one-request refusal.
///
/// Trust: TLS has already checked the chain against the controller's CA (a client without a certificate, or with
/// one from another CA, never gets here). What the certificate cannot say, whether the identity is still active,
/// comes from the controller's block list (`GatewayPolicy`, pushed over the control link); the decision is made
/// per connection, and a connection whose identity is blocked later is closed by the policy (`track`), so a
/// keep-alive connection from before a revocation carries no further request.
final class DeviceGate: ChannelDuplexHandler, RemovableChannelHandler {
    typealias InboundIn = NIOAny
    typealias OutboundIn = NIOAny

    struct Settings: Sendable {
        let core: ProxyCore
        let policy: GatewayPolicy
        let service: String
        let hstsMaxAge: Int64?
        let logger: Logger
        /// How long a client may take over the handshake before the connection is closed (the proxy's idle timeout
        /// only starts once the proxy is set up).
        let handshakeTimeout: TimeAmount
        /// Asks the controller about a certificate the local policy admits (`PolicyLink.check`).
        var check: (@Sendable (IdentityCertificate, any EventLoop) -> EventLoopFuture<PolicyLink.CheckResult>)?
        /// Told of every admitted connection, so the controller is asked about its certificate again while it is open
        /// (`PolicyLink.admitted`).
        var admitted: (@Sendable (any Channel, IdentityCertificate) -> Void)?
    }

    private enum State {
        case handshaking
        /// The local policy admits `peer`; the controller's answer is awaited. What the client sends meanwhile is
        /// held (one TLS read burst at most: reads asked for meanwhile are held too), and handed on after.
        case checking(peer: IdentityCertificate, held: [NIOAny], readPending: Bool)
        case decided
    }

    private let settings: Settings
    private var state = State.handshaking
    private var deadline: Scheduled<Void>?

    init(_ settings: Settings) {
        self.settings = settings
    }

    func handlerAdded(context: ChannelHandlerContext) {
        let channel = context.channel
        deadline = context.eventLoop.scheduleTask(in: settings.handshakeTimeout) { channel.close(promise: nil) }
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        deadline?.cancel()
        deadline = nil
    }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        guard case .handshaking = state, case TLSUserEvent.handshakeCompleted = event else {
            context.fireUserInboundEventTriggered(event)
            return
        }
        let certificate = try? context.pipeline.syncOperations.handler(type: NIOSSLServerHandler.self)
            .peerCertificate?.toDERBytes()
        context.fireUserInboundEventTriggered(event)
        let decision = Self.decide(certificate: certificate, policy: settings.policy, service: settings.service)
        // A device the dial policy leaves out is asked about too: one that is deleted or whose certificate was
        // replaced is then told so (identity_blocked), as before grants, rather than only that it may not dial.
        let denied: Decision?
        let peer: IdentityCertificate
        switch decision {
        case .allow(let allowed):
            (peer, denied) = (allowed, nil)
        case .refuse(let refusal, _) where refusal.code == "dial_denied":
            guard let certificate, let parsed = try? IdentityCertificate(der: certificate) else {
                finish(decision, context: context)
                return
            }
            (peer, denied) = (parsed, decision)
        case .refuse:
            finish(decision, context: context)
            return
        }
        guard let check = settings.check else {
            finish(decision, context: context)
            return
        }
        state = .checking(peer: peer, held: [], readPending: false)
        check(peer, context.eventLoop).assumeIsolated().whenSuccess { [self] result in
            guard case .checking = state, context.channel.isActive else { return }
            switch result {
            case .allowed(dial: true) where denied != nil && settings.policy.grantedByOthers(peer.id, besides: ""):
                // The controller's directory is fresher than the grant: this identity was just created, or a policy
                // just widened, and the grant saying so is on its way. `PolicyLink` added it to the grant in force as
                // the answer came, so the connection is tracked like any other: a narrowing that followed the answer
                // ends it, whether it is applied before `track` (which then closes it) or after (`updateGrant` does).
                // Only if every other controller's grant holds it: the primary's controller may be the one whose
                // store feed is stalled, and another's narrowed grant must keep the identity out (fails closed).
                finish(.allow(peer), context: context)
            case .allowed(dial: false) where denied == nil:
                // A narrowing whose grant has not arrived yet: the controller's answer is the newer one.
                finish(Self.dialDenied(peer, service: settings.service), context: context)
            case .allowed, .unavailable:
                // Unavailable: no link; the local decision (block list, dial policy) stands, within the grace.
                finish(denied ?? .allow(peer), context: context)
            case .noAnswer where denied != nil:
                finish(denied!, context: context)
            case .noAnswer:
                finish(
                    .refuse(
                        ProxyError(
                            status: .serviceUnavailable,
                            code: "policy_unavailable",
                            reason: "The controller did not answer in time; retry shortly."
                        ),
                        identity: peer.name
                    ),
                    context: context
                )
            case .refused(let reason):
                finish(
                    .refuse(
                        ProxyError(status: .forbidden, code: "identity_blocked", reason: Self.sentence(reason)),
                        identity: peer.name
                    ),
                    context: context
                )
            }
        }
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        guard case .checking(let peer, var held, let readPending) = state else {
            context.fireChannelRead(data)
            return
        }
        held.append(data)
        state = .checking(peer: peer, held: held, readPending: readPending)
    }

    func channelReadComplete(context: ChannelHandlerContext) {
        if case .checking = state { return }
        context.fireChannelReadComplete()
    }

    func read(context: ChannelHandlerContext) {
        guard case .checking(let peer, let held, _) = state else {
            context.read()
            return
        }
        state = .checking(peer: peer, held: held, readPending: true)
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        // A failed handshake (no certificate, another CA): NIOSSL has answered with an alert; nothing was proxied.
        settings.logger.debug("TLS handshake failed", metadata: ["error": "\(error)"])
        context.close(promise: nil)
    }

    /// Sets up the rest of the pipeline for `decision`, hands on what was held, and leaves.
    private func finish(_ decision: Decision, context: ChannelHandlerContext) {
        deadline?.cancel()
        deadline = nil
        var held: [NIOAny] = []
        var readPending = false
        if case .checking(_, let waiting, let pending) = state { (held, readPending) = (waiting, pending) }
        state = .decided
        let pipeline = context.pipeline.syncOperations
        do {
            switch decision {
            case .allow(let peer):
                settings.policy.track(context.channel, identityID: peer.id)
                settings.admitted?(context.channel, peer)
                try settings.core.configureClientPipeline(
                    pipeline,
                    client: ClientContext(
                        remoteAddress: context.channel.remoteAddress,
                        scheme: .https,
                        identity: PeerIdentity(id: peer.id, name: peer.name)
                    )
                )
            case .refuse(let refusal, let name):
                GatewayMetrics.refusal(refusal.code)
                settings.logger.notice(
                    "client refused",
                    metadata: [
                        "code": "\(refusal.code)", "identity": "\(name ?? "-")",
                        "client": "\(context.channel.remoteAddress?.displayString ?? "-")",
                    ]
                )
                try RefusalResponder.configure(pipeline, refusal: refusal, timeout: settings.handshakeTimeout)
            }
            if let maxAge = settings.hstsMaxAge { try StrictTransportSecurityHandler.install(pipeline, maxAge: maxAge) }
        } catch {
            context.close(promise: nil)
            return
        }
        for data in held { context.fireChannelRead(data) }
        if !held.isEmpty { context.fireChannelReadComplete() }
        if readPending { context.read() }
        pipeline.removeHandler(context: context, promise: nil)
    }

    /// The controller's reason as a sentence for the client.
    private static func sentence(_ reason: String) -> String {
        let text = reason.prefix(1).uppercased() + reason.dropFirst()
        return text.hasSuffix(".") ? text : text + "."
    }

    enum Decision {
        case allow(IdentityCertificate)
        case refuse(ProxyError, identity: String?)
    }

    /// The gateway's decision on a verified client certificate. Checked in this order: an identity certificate at
    /// all, not blocked, the policy known, and the service's dial policy (the controller's grant, or its roles from
    /// a controller of an earlier release).
    static func decide(certificate: [UInt8]?, policy: GatewayPolicy, service: String) -> Decision {
        guard let certificate, let peer = try? IdentityCertificate(der: certificate) else {
            return .refuse(
                ProxyError(
                    status: .forbidden,
                    code: "identity_invalid",
                    reason: "The client certificate is not an ils-gateway identity certificate."
                ),
                identity: nil
            )
        }
        guard !policy.blocks(peer.id) else {
            return .refuse(
                ProxyError(
                    status: .forbidden,
                    code: "identity_blocked",
                    reason: "Identity '\(peer.name)' is revoked or disabled."
                ),
                identity: peer.name
            )
        }
        guard policy.isKnown else {
            return .refuse(
                ProxyError(
                    status: .serviceUnavailable,
                    code: "policy_unavailable",
                    reason: "The gateway has no current policy from the controller; retry shortly."
                ),
                identity: peer.name
            )
        }
        if case .deny = policy.decide(peer, service: service, hosted: service) {
            return dialDenied(peer, service: service)
        }
        return .allow(peer)
    }

    static func dialDenied(_ peer: IdentityCertificate, service: String) -> Decision {
        .refuse(
            ProxyError(
                status: .forbidden,
                code: "dial_denied",
                reason: "Identity '\(peer.name)' may not use '\(service)'."
            ),
            identity: peer.name
        )
    }
}
