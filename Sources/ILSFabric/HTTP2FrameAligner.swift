public import NIOCore

/// Sits in front of `NIOHTTP2Handler` on every overlay connection and hands it whole HTTP/2 frames only, at most
/// `batchLimit` bytes per read.
///
/// swift-nio-http2's frame decoder keeps one accumulation buffer for the connection's whole life, and that buffer only
/// ever grows: each read is appended at its write index, the indices are reset only when the buffer runs empty, and a
/// copy-on-write (DATA frames are slices of it) keeps the old capacity. A read that ends in the middle of a frame and
/// more reads before the buffer drains push the write index up and double the capacity; the 30-minute soak found
/// 2–4 MiB per long-lived gateway link after some minutes of mixed load (heaptrack: live allocations in
/// `SimulatingDataFramesParserState.accumulate`), the gateway's "step that stays" in docs/soak.md. Given whole
/// frames, the decoder empties its buffer after every read, so the buffer never holds more than one read's worth.
///
/// The incomplete frame at the end of a read is copied out into a buffer of exactly that frame's size (so the TLS
/// handler's read buffer is not kept alive by a slice) and released once the frame is complete. Frames longer than
/// `maximumFrameSize` are a protocol error the HTTP/2 handler reports; from such a frame on, bytes pass through
/// untouched so that it sees and rejects it. The server side first passes the 24-byte connection preface through.
public final class HTTP2FrameAligner: ChannelInboundHandler {
    public typealias InboundIn = ByteBuffer
    public typealias InboundOut = ByteBuffer

    static let headerSize = 9
    static let prefaceSize = 24

    /// Header plus the largest payload this side announces: the longest frame, and the most passed on in one read.
    private let batchLimit: Int
    private var prefaceLeft: Int
    /// The start of a frame whose end has not arrived yet (fewer than `headerSize` bytes, or a whole header and part
    /// of the payload).
    private var pending: ByteBuffer?
    private var passThrough = false

    /// - Parameters:
    ///   - expectsPreface: the server side: the peer sends the client connection preface first.
    ///   - maximumFrameSize: the largest frame this side announces (SETTINGS_MAX_FRAME_SIZE).
    public init(expectsPreface: Bool, maximumFrameSize: Int = FabricProtocol.maximumFrameSize) {
        self.prefaceLeft = expectsPreface ? Self.prefaceSize : 0
        self.batchLimit = Self.headerSize + maximumFrameSize
    }

    public func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        var input = unwrapInboundIn(data)
        if passThrough {
            context.fireChannelRead(wrapInboundOut(input))
            return
        }
        if prefaceLeft > 0 {
            let preface = input.readSlice(length: min(prefaceLeft, input.readableBytes))!
            prefaceLeft -= preface.readableBytes
            context.fireChannelRead(wrapInboundOut(preface))
        }
        guard completePending(context: context, input: &input) else { return }
        if !passThrough {
            forwardWholeFrames(context: context, input: &input)
        }
        if passThrough {
            if input.readableBytes > 0 {
                context.fireChannelRead(wrapInboundOut(input))
            }
        } else if input.readableBytes > 0 {
            var rest = context.channel.allocator.buffer(
                capacity: frameLength(input, at: input.readerIndex) ?? Self.headerSize
            )
            rest.writeImmutableBuffer(input)
            pending = rest
        }
    }

    /// Moves bytes from `input` into the pending frame; passes it on once whole. False when `input` ran out first.
    private func completePending(context: ChannelHandlerContext, input: inout ByteBuffer) -> Bool {
        guard var frame = pending else { return true }
        if frame.readableBytes < Self.headerSize {
            var head = input.readSlice(length: min(Self.headerSize - frame.readableBytes, input.readableBytes))!
            frame.writeBuffer(&head)
            pending = frame
            guard frame.readableBytes == Self.headerSize else { return false }
        }
        let length = frameLength(frame, at: frame.readerIndex)!
        guard length <= batchLimit else {
            startPassingThrough(context: context, with: frame)
            return true
        }
        if frame.capacity < length {  // exactly one frame's size, not the next power of two
            var sized = context.channel.allocator.buffer(capacity: length)
            sized.writeBuffer(&frame)
            frame = sized
        }
        var body = input.readSlice(length: min(length - frame.readableBytes, input.readableBytes))!
        frame.writeBuffer(&body)
        guard frame.readableBytes == length else {
            pending = frame
            return false
        }
        pending = nil
        context.fireChannelRead(wrapInboundOut(frame))
        return true
    }

    /// Passes on the whole frames at the front of `input`, several to a read up to `batchLimit` bytes.
    private func forwardWholeFrames(context: ChannelHandlerContext, input: inout ByteBuffer) {
        while true {
            var end = input.readerIndex
            while let length = frameLength(input, at: end) {
                guard length <= batchLimit else {
                    passThrough = true
                    break
                }
                guard end + length <= input.writerIndex,
                    end == input.readerIndex || end + length - input.readerIndex <= batchLimit
                else { break }
                end += length
            }
            guard end > input.readerIndex else { return }
            context.fireChannelRead(wrapInboundOut(input.readSlice(length: end - input.readerIndex)!))
            if passThrough { return }
        }
    }

    private func startPassingThrough(context: ChannelHandlerContext, with frame: ByteBuffer) {
        passThrough = true
        pending = nil
        context.fireChannelRead(wrapInboundOut(frame))
    }

    /// Header plus payload length of the frame starting at `index`, once its header is readable.
    private func frameLength(_ buffer: ByteBuffer, at index: Int) -> Int? {
        guard buffer.writerIndex - index >= Self.headerSize,
            let high = buffer.getInteger(at: index, as: UInt8.self),
            let low = buffer.getInteger(at: index + 1, as: UInt16.self)
        else { return nil }
        return Self.headerSize + (Int(high) << 16 | Int(low))
    }
}
