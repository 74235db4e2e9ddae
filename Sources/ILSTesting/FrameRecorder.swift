public import NIOCore
public import NIOHTTP2

/// Records every frame payload an HTTP/2 stream channel reads, for tests that play one end of an overlay link on
/// embedded channels.
public final class FrameRecorder: ChannelInboundHandler, @unchecked Sendable {
    public typealias InboundIn = HTTP2Frame.FramePayload
    private let record: (HTTP2Frame.FramePayload) -> Void

    public init(_ record: @escaping (HTTP2Frame.FramePayload) -> Void) { self.record = record }

    public func channelRead(context: ChannelHandlerContext, data: NIOAny) { record(unwrapInboundIn(data)) }
}
