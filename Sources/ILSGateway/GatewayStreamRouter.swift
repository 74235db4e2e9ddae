import Foundation
public import ILSCore
public import ILSCrypto
public import ILSFabric
import ILSProxy
import Logging
import NIOConcurrencyHelpers
import NIOCore
import NIOHPACK
import NIOHTTP2

/// What the gateway currently knows from the controller: who may dial the service it hosts, and who is revoked.
public final class GatewayPolicy: Sendable {
    private let dialRoles = NIOLockedValueBox<[IdentityRole]?>(nil)
    private let revoked = NIOLockedValueBox<Set<String>>([])

    public init() {}

    public func update(_ roles: [IdentityRole]) { dialRoles.withLockedValue { $0 = roles } }

    /// Replaces the revocation list (the controller sends the whole list on every connection).
    public func updateRevoked(_ ids: [String]) { revoked.withLockedValue { $0 = Set(ids) } }

    var isKnown: Bool { dialRoles.withLockedValue { $0 != nil } }

    /// The gateway's own decision, made after it verified the device's certificate itself. Until the controller
    /// has sent the policy, nobody gets in.
    public func decide(_ peer: IdentityCertificate, service: String, hosted: String) -> AccessDecision {
        guard service == hosted else { return .deny(reason: "this gateway hosts '\(hosted)', not '\(service)'") }
        // Checked before anything else about the identity: a revoked device stays out even if a relay
        // misbehaves and lets its circuit through.
        guard !revoked.withLockedValue({ $0.contains(peer.id) }) else {
            return .deny(reason: "identity '\(peer.name)' is revoked")
        }
        guard let roles = dialRoles.withLockedValue({ $0 }) else {
            return .deny(reason: "the gateway has not received its policy yet; retry shortly")
        }
        guard roles.contains(peer.role) else {
            return .deny(reason: "identity '\(peer.name)' (role \(peer.role.rawValue)) may not dial '\(service)'")
        }
        return .allow
    }
}

/// The first handler of every stream the controller opens to the gateway. The control stream (`GET
/// /ils/v1/host`) is answered with the hosted service and then carries the policy; a `CONNECT` becomes a circuit:
/// end-to-end handshake first, then the proxy core.
final class GatewayStreamRouter: ChannelInboundHandler, RemovableChannelHandler {
    typealias InboundIn = HTTP2Frame.FramePayload
    typealias OutboundOut = HTTP2Frame.FramePayload

    struct Context: Sendable {
        let service: String
        let credentials: E2EHandshake.Credentials
        let policy: GatewayPolicy
        let core: ProxyCore
        let logger: Logger
        /// Called with the controller's refusal to let this gateway host the service.
        let onRefusal: @Sendable (String) -> Void
    }

    private let settings: Context
    private var isControl = false

    init(_ settings: Context) {
        self.settings = settings
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        let payload = unwrapInboundIn(data)
        if isControl {
            readControl(payload, context: context)
            return
        }
        guard case .headers(let request) = payload else {
            context.close(promise: nil)
            return
        }
        if request.headers.first(name: ":path") == FabricProtocol.controlPath {
            isControl = true
            let headers = HPACKHeaders([(":status", "200"), (FabricProtocol.serviceHeader, settings.service)])
            context.writeAndFlush(wrapOutboundOut(.headers(.init(headers: headers))), promise: nil)
            return
        }
        let settings = self.settings
        let acceptor = CircuitAcceptor { service, _, stream in
            guard service == settings.service else {
                return stream.eventLoop.makeSucceededFuture(
                    .refuse(status: 404, code: "unknown_service", reason: "this gateway hosts '\(settings.service)'")
                )
            }
            return stream.eventLoop.makeSucceededFuture(
                .accept(install: { pipeline in
                    try pipeline.addHandler(StreamDataCodec())
                    try pipeline.addHandler(ByteToMessageHandler(FrameDecoder()))
                    try pipeline.addHandler(MessageToByteHandler(FrameEncoder()))
                    try pipeline.addHandler(
                        E2EResponderHandler(
                            credentials: settings.credentials,
                            authorize: { peer, requested in
                                let decision = settings.policy.decide(
                                    peer,
                                    service: requested,
                                    hosted: settings.service
                                )
                                if case .deny(let reason) = decision {
                                    settings.logger.notice("circuit refused", metadata: ["reason": "\(reason)"])
                                }
                                return decision
                            },
                            onEstablished: { pipeline, event in
                                try settings.core.configureClientPipeline(
                                    pipeline,
                                    client: ClientContext(remoteAddress: nil, scheme: .https, identity: event.peer)
                                )
                            }
                        )
                    )
                })
            )
        }
        do {
            try context.pipeline.syncOperations.addHandler(acceptor, position: .after(self))
        } catch {
            context.close(promise: nil)
            return
        }
        context.fireChannelRead(data)
        context.pipeline.syncOperations.removeHandler(self, promise: nil)
    }

    private func readControl(_ payload: HTTP2Frame.FramePayload, context: ChannelHandlerContext) {
        guard case .data(let frame) = payload, case .byteBuffer(let buffer) = frame.data else { return }
        guard let message = try? JSONDecoder().decode(HostControlMessage.self, from: Data(buffer.readableBytesView))
        else { return }
        if let roles = message.dialRoles {
            settings.policy.updateRevoked(message.revoked ?? [])
            settings.policy.update(roles)
            settings.logger.info("hosting service", metadata: ["service": "\(settings.service)"])
        } else if let error = message.error {
            settings.onRefusal(error)
        }
    }
}
