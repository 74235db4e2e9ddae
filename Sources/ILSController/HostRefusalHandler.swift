import Foundation
import ILSFabric
import NIOCore
import NIOHPACK
import NIOHTTP2

/// The controller's end of the control stream of a gateway link whose identity may not host at all (revoked,
/// disabled, deleted, or a certificate that `renew` or `reissue` replaced): the gateway is told why, with
/// `errorCode` `identity_blocked`, and the link closes. Before this the link was closed without a word, the gateway
/// never said why, and it reconnected about 12 times a second.
final class HostRefusalHandler: ChannelInboundHandler {
    typealias InboundIn = HTTP2Frame.FramePayload
    typealias OutboundOut = HTTP2Frame.FramePayload

    private let reason: String

    init(reason: String) {
        self.reason = reason
    }

    func handlerAdded(context: ChannelHandlerContext) {
        let headers = HPACKHeaders([
            (":method", "GET"), (":scheme", "https"), (":authority", "controller"),
            (":path", FabricProtocol.controlPath),
        ])
        context.writeAndFlush(wrapOutboundOut(.headers(.init(headers: headers))), promise: nil)
    }

    /// The gateway's answer (the service it would host) is not looked at: the refusal is about the identity.
    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        guard case .headers = unwrapInboundIn(data) else { return }
        let message = HostControlMessage(error: reason, errorCode: HostControlMessage.identityBlocked)
        var body = (try? JSONEncoder().encode(message)) ?? Data()
        body.append(UInt8(ascii: "\n"))
        let parent = context.channel.parent
        context.writeAndFlush(
            wrapOutboundOut(.data(.init(data: .byteBuffer(ByteBuffer(bytes: body)), endStream: true)))
        ).whenComplete { _ in parent?.close(promise: nil) }
    }
}
