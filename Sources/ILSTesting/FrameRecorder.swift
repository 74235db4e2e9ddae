public import NIOCore
public import NIOEmbedded
public import NIOHTTP2

/// Records every frame payload an HTTP/2 stream channel reads, for tests that play one end of an overlay link on
/// embedded channels.
public final class FrameRecorder: ChannelInboundHandler, @unchecked Sendable {
    public typealias InboundIn = HTTP2Frame.FramePayload
    private let record: (HTTP2Frame.FramePayload) -> Void

    public init(_ record: @escaping (HTTP2Frame.FramePayload) -> Void) { self.record = record }

    public func channelRead(context: ChannelHandlerContext, data: NIOAny) { record(unwrapInboundIn(data)) }
}

/// Carries what each of two embedded channels wrote to the other, back and forth `rounds` times (each direction's
/// bytes as one read, as a fast peer's writes arrive together), so an HTTP/2 exchange between them settles. Bytes for
/// a channel that has closed are dropped.
public func exchangeBytes(_ one: EmbeddedChannel, _ other: EmbeddedChannel, rounds: Int = 4) throws {
    for _ in 0..<rounds {
        for (from, to) in [(one, other), (other, one)] {
            // What a handler left for the next tick (`CircuitAcceptor` answers a head on the next one) is written now.
            from.embeddedEventLoop.run()
            var bytes = ByteBuffer()
            while var piece = try from.readOutbound(as: ByteBuffer.self) { bytes.writeBuffer(&piece) }
            if bytes.readableBytes > 0, to.isActive { try to.writeInbound(bytes) }
        }
    }
}
