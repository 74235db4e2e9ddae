import Foundation
import ILSCore
import ILSFabric
import NIOCore
import NIOHPACK
import NIOHTTP2

/// The controller's end of a gateway's control stream: asks which service it hosts, checks the bind policy, and
/// answers with the dial policy (or the refusal).
final class HostControlHandler: ChannelInboundHandler {
    typealias InboundIn = HTTP2Frame.FramePayload
    typealias OutboundOut = HTTP2Frame.FramePayload

    private let gateway: IdentityRecord
    private let controller: Controller
    /// The event loop the gateway's connection is on, of how many.
    private let link: (loop: Int?, loops: Int)
    private let register: @Sendable (String) -> Void

    init(
        gateway: IdentityRecord,
        controller: Controller,
        link: (loop: Int?, loops: Int),
        register: @escaping @Sendable (String) -> Void
    ) {
        self.gateway = gateway
        self.controller = controller
        self.link = link
        self.register = register
    }

    func handlerAdded(context: ChannelHandlerContext) {
        let headers = HPACKHeaders([
            (":method", "GET"), (":scheme", "https"), (":authority", "controller"),
            (":path", FabricProtocol.controlPath),
        ])
        context.writeAndFlush(wrapOutboundOut(.headers(.init(headers: headers))), promise: nil)
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        guard case .headers(let answer) = unwrapInboundIn(data),
            let service = answer.headers.first(name: FabricProtocol.serviceHeader)
        else { return }
        let message: HostControlMessage
        let policy = try? controller.state.store.service(named: service)
        let accepted = policy.map { $0.bindRoles.contains(gateway.role) } ?? false
        if let policy, accepted {
            message = HostControlMessage(
                dialRoles: policy.dialRoles,
                blocked: controller.blockedIdentityIDs(),
                relayLoop: link.loop,
                relayLoops: link.loops
            )
        } else {
            let reason =
                policy == nil
                ? "there is no service named '\(service)'"
                : "identity '\(gateway.name)' (role \(gateway.role.rawValue)) may not host '\(service)'"
            message = HostControlMessage(error: reason)
            try? controller.state.store.audit(
                actor: gateway.name,
                action: "bind.refused",
                target: service,
                detail: reason
            )
        }
        var body = (try? JSONEncoder().encode(message)) ?? Data()
        body.append(UInt8(ascii: "\n"))
        let refused = message.error != nil
        // Registered before the message is written, in the same turn of this connection's loop: the gateway reports
        // itself hosting once it has the message, and a device dialling at that moment must find it registered (the
        // other order let a dial fall between the two and get 503 service_unavailable). Circuits still reach the
        // gateway after the message: a circuit's stream is created on this loop, after this turn, so its head follows
        // the message on the wire, and the gateway knows the policy and which loop it is on before its first circuit
        // (it drops a link that landed on a loop it covers before any circuit).
        if accepted { register(service) }
        let parent = context.channel.parent
        context.writeAndFlush(
            wrapOutboundOut(.data(.init(data: .byteBuffer(ByteBuffer(bytes: body)), endStream: refused)))
        ).whenComplete { _ in
            if refused { parent?.close(promise: nil) }
        }
    }
}
