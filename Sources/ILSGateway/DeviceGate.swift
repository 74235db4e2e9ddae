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
final class DeviceGate: ChannelInboundHandler, RemovableChannelHandler {
    typealias InboundIn = NIOAny

    struct Settings: Sendable {
        let core: ProxyCore
        let policy: GatewayPolicy
        let service: String
        let hstsMaxAge: Int64?
        let logger: Logger
        /// How long a client may take over the handshake before the connection is closed (the proxy's idle timeout
        /// only starts once the proxy is set up).
        let handshakeTimeout: TimeAmount
    }

    private let settings: Settings
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
        guard case TLSUserEvent.handshakeCompleted = event else {
            context.fireUserInboundEventTriggered(event)
            return
        }
        deadline?.cancel()
        deadline = nil
        let pipeline = context.pipeline.syncOperations
        let certificate = try? pipeline.handler(type: NIOSSLServerHandler.self).peerCertificate?.toDERBytes()
        do {
            switch Self.decide(certificate: certificate, policy: settings.policy, service: settings.service) {
            case .allow(let peer):
                settings.policy.track(context.channel, identityID: peer.id)
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
        context.fireUserInboundEventTriggered(event)
        pipeline.removeHandler(context: context, promise: nil)
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        // A failed handshake (no certificate, another CA): NIOSSL has answered with an alert; nothing was proxied.
        settings.logger.debug("TLS handshake failed", metadata: ["error": "\(error)"])
        context.close(promise: nil)
    }

    enum Decision {
        case allow(IdentityCertificate)
        case refuse(ProxyError, identity: String?)
    }

    /// The gateway's decision on a verified client certificate. Checked in this order: an identity certificate at
    /// all, a device's, not blocked, the policy known, and the service's dial roles.
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
        guard peer.role == .device else {
            return .refuse(
                ProxyError(
                    status: .forbidden,
                    code: "dial_denied",
                    reason: "Only device identities may use this gateway; '\(peer.name)' is a \(peer.role.rawValue)."
                ),
                identity: peer.name
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
            return .refuse(
                ProxyError(
                    status: .forbidden,
                    code: "dial_denied",
                    reason: "Identity '\(peer.name)' may not use '\(service)'."
                ),
                identity: peer.name
            )
        }
        return .allow(peer)
    }
}
