import Foundation
import ILSCore
import ILSFabric
import NIOCore
import NIOHPACK
import NIOHTTP2

/// The first handler of every stream the controller opens on an HTTP-mode gateway's policy link. The control stream
/// (`GET /ils/v1/host`) is answered with the service and `ils-link: policy` (so the controller never registers the
/// link for circuits), and then carries the policy and block list as JSON lines. Any other stream is refused: this
/// link hosts nothing. The gateway asks the controller about each client's certificate on the same stream
/// (`CertificateCheck` lines out, `CertificateVerdict` lines back).
final class PolicyLinkRouter: ChannelInboundHandler {
    typealias InboundIn = HTTP2Frame.FramePayload
    typealias OutboundOut = HTTP2Frame.FramePayload

    /// A control message longer than this closes the link: the full block list of a large deployment is far
    /// smaller (a thousand ids is about 40 KiB).
    static let maximumMessageBytes = 4 * 1024 * 1024

    /// What the router passes on to its link.
    struct Events: Sendable {
        /// The control stream is open on `connection`: certificate checks are written on it.
        var onControlStream: @Sendable (_ stream: any Channel, _ connection: any Channel) -> Void
        /// A policy message, with the link's connection.
        var onMessage: @Sendable (HostControlMessage, _ connection: any Channel) -> Void
        var onVerdict: @Sendable (CertificateVerdict) -> Void

        static let ignoring = Events(onControlStream: { _, _ in }, onMessage: { _, _ in }, onVerdict: { _ in })
    }

    private let service: String
    private let events: Events
    private var isControl = false
    private var buffer = ByteBuffer()

    init(service: String, events: Events) {
        self.service = service
        self.events = events
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
        guard request.headers.first(name: ":path") == FabricProtocol.controlPath else {
            let refusal = HPACKHeaders([
                (":status", "404"), (FabricProtocol.errorHeader, "not_hosting"),
                (FabricProtocol.reasonHeader, "this gateway serves HTTP mode and hosts no circuits"),
            ])
            context.writeAndFlush(wrapOutboundOut(.headers(.init(headers: refusal, endStream: true))), promise: nil)
            return
        }
        isControl = true
        let headers = HPACKHeaders([
            (":status", "200"), (FabricProtocol.serviceHeader, service),
            (FabricProtocol.linkPurposeHeader, FabricProtocol.policyLink),
        ])
        context.writeAndFlush(wrapOutboundOut(.headers(.init(headers: headers))), promise: nil)
        events.onControlStream(context.channel, Self.connection(of: context.channel))
    }

    /// The link's connection, which a stream's parent is (a test's stream, played on a channel of its own with no
    /// parent, stands for its connection).
    static func connection(of stream: any Channel) -> any Channel { stream.parent ?? stream }

    private func readControl(_ payload: HTTP2Frame.FramePayload, context: ChannelHandlerContext) {
        guard case .data(let frame) = payload, case .byteBuffer(var bytes) = frame.data else { return }
        buffer.writeBuffer(&bytes)
        guard buffer.readableBytes <= Self.maximumMessageBytes else {
            context.channel.parent?.close(promise: nil)
            return
        }
        while let newline = buffer.readableBytesView.firstIndex(of: UInt8(ascii: "\n")) {
            let line = buffer.readSlice(length: newline - buffer.readerIndex)!
            buffer.moveReaderIndex(forwardBy: 1)
            let json = Data(line.readableBytesView)
            // A verdict has keys a policy message never has; every key of a policy message is optional, so the
            // verdict is tried first.
            if let verdict = try? JSONDecoder().decode(CertificateVerdict.self, from: json) {
                events.onVerdict(verdict)
            } else if let message = try? JSONDecoder().decode(HostControlMessage.self, from: json) {
                events.onMessage(message, Self.connection(of: context.channel))
            }
        }
        buffer.discardReadBytes()
    }
}
