import Foundation
import ILSCore
import ILSFabric
import NIOCore
import NIOHPACK
import NIOHTTP2

/// The controller's end of a gateway's control stream: asks which service it hosts, checks the bind policy, and
/// answers with the dial policy (or the refusal).
///
/// A gateway that serves devices itself (HTTP mode with client certificates) answers with `ils-link: policy`: it
/// gets the same policy and every block-list push, under the same bind check, but is not registered with the relay,
/// so no circuit is ever routed to it.
final class HostControlHandler: ChannelInboundHandler {
    typealias InboundIn = HTTP2Frame.FramePayload
    typealias OutboundOut = HTTP2Frame.FramePayload

    /// What an accepted link is registered for.
    enum Registration: Sendable {
        /// One step for both: pushes and the relay (a policy-only link is then registered with the relay too, and
        /// refuses every circuit the relay tries on it, which moves on to the next gateway).
        case combined(@Sendable (_ service: String) -> Void)
        /// `subscribe` registers the control stream for block-list pushes; `host` registers the link with the
        /// relay for circuits, and is not called for a policy-only link.
        case separate(subscribe: @Sendable (_ service: String) -> Void, host: @Sendable (_ service: String) -> Void)
    }

    private let gateway: IdentityRecord
    private let controller: Controller
    /// The event loop the gateway's connection is on, of how many.
    private let link: (loop: Int?, loops: Int)
    private let registration: Registration
    /// The service of an accepted policy-only link: from then on the gateway's DATA frames carry `CertificateCheck`s,
    /// each answered with whether that service's dial policy allows the identity now.
    private var checkedService: String?
    private var checkBuffer = ByteBuffer()

    /// A policy link's pending question bytes beyond this close the link: a check is about 150 bytes.
    static let maximumCheckBytes = 64 * 1024

    init(
        gateway: IdentityRecord,
        controller: Controller,
        link: (loop: Int?, loops: Int),
        registration: Registration
    ) {
        self.gateway = gateway
        self.controller = controller
        self.link = link
        self.registration = registration
    }

    convenience init(
        gateway: IdentityRecord,
        controller: Controller,
        link: (loop: Int?, loops: Int),
        register: @escaping @Sendable (String) -> Void
    ) {
        self.init(gateway: gateway, controller: controller, link: link, registration: .combined(register))
    }

    func handlerAdded(context: ChannelHandlerContext) {
        let headers = HPACKHeaders([
            (":method", "GET"), (":scheme", "https"), (":authority", "controller"),
            (":path", FabricProtocol.controlPath),
        ])
        context.writeAndFlush(wrapOutboundOut(.headers(.init(headers: headers))), promise: nil)
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        let payload = unwrapInboundIn(data)
        if let checkedService {
            readChecks(payload, service: checkedService, context: context)
            return
        }
        guard case .headers(let answer) = payload,
            let service = answer.headers.first(name: FabricProtocol.serviceHeader)
        else { return }
        let policyOnly = answer.headers.first(name: FabricProtocol.linkPurposeHeader) == FabricProtocol.policyLink
        let message: HostControlMessage
        let accepted: Bool
        if let invalid = Self.invalidServiceName(service) {
            // Checked before the name goes anywhere: the store, the audit log, the relay, a log line. The name is a
            // peer's choice, and with terminal escapes in it `admin audit` would print forged lines.
            accepted = false
            message = HostControlMessage(error: invalid)
            controller.state.auditQueue.append(
                actor: gateway.name,
                action: "bind.refused",
                target: Self.visible(service),
                detail: invalid
            )
        } else {
            let policy = controller.state.identities.service(named: service)
            // The record as it is now (its attributes may have changed since the connection was made).
            let current = controller.state.identities.identity(id: gateway.id) ?? gateway
            accepted = policy.map { $0.bind.allows(current) } ?? false
            if let policy, accepted {
                // Subscribed before the grant is read: a grant pushed after this point reaches this stream, after
                // this answer (a push from another thread is queued behind this turn), and one pushed before it was
                // computed from a directory no newer than the one read here.
                subscribe(service, policyOnly: policyOnly)
                message = HostControlMessage(
                    // Kept for gateways of an earlier release, and because its presence means "bound".
                    dialRoles: policy.dial.legacyRoles,
                    blocked: controller.blockedIdentityIDs(),
                    dialGrant: controller.dialGrant(for: policy),
                    relayLoop: policyOnly ? nil : link.loop,
                    relayLoops: policyOnly ? nil : link.loops,
                    // Left out while the roster cannot be trusted yet (`ControllerRoster.announced`): a gateway keeps
                    // the list it has rather than dropping the other controllers' links, grants and blocks.
                    controllers: controller.state.roster.announced
                )
            } else {
                let reason =
                    policy == nil
                    ? "there is no service named '\(service)'"
                    : "identity '\(gateway.name)' (role \(gateway.role.rawValue)) may not host '\(service)'"
                message = HostControlMessage(error: reason)
                controller.state.auditQueue.append(
                    actor: gateway.name,
                    action: "bind.refused",
                    target: service,
                    detail: reason
                )
            }
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
        checkedService = accepted && policyOnly ? service : nil
        let parent = context.channel.parent
        context.writeAndFlush(
            wrapOutboundOut(.data(.init(data: .byteBuffer(ByteBuffer(bytes: body)), endStream: refused)))
        ).whenComplete { _ in
            if refused { parent?.close(promise: nil) }
        }
    }

    /// Registers an accepted link: for pushes, and with the relay unless it is policy-only.
    private func subscribe(_ service: String, policyOnly: Bool) {
        switch registration {
        case .combined(let register):
            register(service)
        case .separate(let subscribe, let host):
            subscribe(service)
            if !policyOnly { host(service) }
        }
    }

    /// Answers each `CertificateCheck` line of a policy link from the store, as the relay checks each circuit: the
    /// identity must exist, be active, and the certificate must be its current one. An allowed answer also says
    /// whether `service`'s dial policy allows the identity now (the relay's own dial check), so the gateway need not
    /// wait for a grant that is on its way.
    private func readChecks(_ payload: HTTP2Frame.FramePayload, service: String, context: ChannelHandlerContext) {
        guard case .data(let frame) = payload, case .byteBuffer(var bytes) = frame.data else { return }
        checkBuffer.writeBuffer(&bytes)
        guard checkBuffer.readableBytes <= Self.maximumCheckBytes else {
            context.channel.parent?.close(promise: nil)
            return
        }
        var answers = ByteBuffer()
        while let newline = checkBuffer.readableBytesView.firstIndex(of: UInt8(ascii: "\n")) {
            let line = checkBuffer.readSlice(length: newline - checkBuffer.readerIndex)!
            checkBuffer.moveReaderIndex(forwardBy: 1)
            guard let check = try? JSONDecoder().decode(CertificateCheck.self, from: Data(line.readableBytesView))
            else { continue }
            let verdict: CertificateVerdict
            do {
                let identity = try controller.activeIdentity(id: check.id, fingerprint: check.fingerprint)
                let dial = controller.state.identities.service(named: service)?.dial.allows(identity) ?? false
                verdict = CertificateVerdict(verdict: check.check, allowed: true, dial: dial)
            } catch {
                verdict = CertificateVerdict(verdict: check.check, allowed: false, reason: error.reason)
            }
            guard var encoded = try? JSONEncoder().encode(verdict) else { continue }
            encoded.append(UInt8(ascii: "\n"))
            answers.writeBytes(encoded)
        }
        checkBuffer.discardReadBytes()
        guard answers.readableBytes > 0 else { return }
        context.writeAndFlush(wrapOutboundOut(.data(.init(data: .byteBuffer(answers)))), promise: nil)
    }

    /// Why `service` cannot be a service name (the rules of identity names: 1-64 of `a-z A-Z 0-9 . _ -`, not
    /// starting with `.` or `-`), or `nil` when it can. The reason never repeats the name.
    static func invalidServiceName(_ service: String) -> String? {
        do {
            try IdentityName.validate(service)
            return nil
        } catch {
            return "the service name the gateway sent is not valid; use 1-64 letters, digits, '.', '_' or '-'"
        }
    }

    /// `text` with everything but printable ASCII written as `\u{…}` (and `\` doubled), cut to 64 characters: an
    /// invalid name as the audit log keeps it, so an admin sees what was sent and no terminal acts on it.
    static func visible(_ text: String) -> String {
        var out = ""
        for scalar in text.unicodeScalars.prefix(64) {
            switch scalar.value {
            case 0x5C: out += "\\\\"
            case 0x20...0x7E: out.unicodeScalars.append(scalar)
            default: out += "\\u{\(String(scalar.value, radix: 16))}"
            }
        }
        return text.unicodeScalars.count > 64 ? out + "…" : out
    }
}
