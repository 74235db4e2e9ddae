public import NIOCore
public import NIOHTTP2

/// Turns an HTTP/2 stream's DATA frames into a plain byte stream and back. END_STREAM in maps to `inputClosed`; a
/// half-close out maps to an empty DATA frame with END_STREAM. Headers never reach it: `CircuitHeaders` handles
/// them and leaves the pipeline first.
public final class StreamDataCodec: ChannelDuplexHandler, RemovableChannelHandler {
    public typealias InboundIn = HTTP2Frame.FramePayload
    public typealias InboundOut = ByteBuffer
    public typealias OutboundIn = ByteBuffer
    public typealias OutboundOut = HTTP2Frame.FramePayload

    private var sentEnd = false

    public init() {}

    public func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        guard case .data(let payload) = unwrapInboundIn(data) else { return }
        if case .byteBuffer(let buffer) = payload.data, buffer.readableBytes > 0 {
            // Passed on as it came (a slice of the HTTP/2 decoder's buffer): `FrameDecoder` next copies only the
            // part of a record that it has to hold.
            context.fireChannelRead(wrapInboundOut(buffer))
        }
        if payload.endStream {
            context.fireUserInboundEventTriggered(ChannelEvent.inputClosed)
        }
    }

    public func write(context: ChannelHandlerContext, data: NIOAny, promise: EventLoopPromise<Void>?) {
        let buffer = unwrapOutboundIn(data)
        context.write(wrapOutboundOut(.data(.init(data: .byteBuffer(buffer)))), promise: promise)
    }

    public func close(context: ChannelHandlerContext, mode: CloseMode, promise: EventLoopPromise<Void>?) {
        guard mode == .output else {
            context.close(mode: mode, promise: promise)
            return
        }
        guard !sentEnd else {
            promise?.succeed()
            return
        }
        sentEnd = true
        context.writeAndFlush(
            wrapOutboundOut(.data(.init(data: .byteBuffer(ByteBuffer()), endStream: true))),
            promise: promise
        )
    }

    /// The bytes of a received DATA frame in a buffer of their own.
    ///
    /// swift-nio-http2 hands out DATA payloads that share its frame decoder's accumulation buffer (a DATA frame that
    /// spans reads is synthesised as "the entire buffer"). Whoever keeps such a payload past the read (the relay's
    /// writes in flight to another connection) makes the decoder's next read copy-on-write its whole buffer, and
    /// keeps that buffer alive meanwhile. The relay makes one right-sized copy instead. (At the circuit ends,
    /// `FrameDecoder` copies only the incomplete record it holds.)
    public static func detached(_ buffer: ByteBuffer, allocator: ByteBufferAllocator) -> ByteBuffer {
        var own = allocator.buffer(capacity: buffer.readableBytes)
        own.writeImmutableBuffer(buffer)
        return own
    }
}
