public import NIOCore

/// Sits in front of `NIOHTTP2Handler` on every overlay connection and hands it whole HTTP/2 frames only: all the whole
/// frames of a read in one read, and a frame completed from the bytes held since the last read just before them.
///
/// swift-nio-http2's frame decoder keeps one accumulation buffer for the connection's whole life, and that buffer only
/// ever grows: each read is appended at its write index, the indices are reset only when the buffer runs empty, and a
/// copy-on-write (DATA frames are slices of it) keeps the old capacity. A read that ends in the middle of a frame and
/// more reads before the buffer drains push the write index up and double the capacity; the 30-minute soak found
/// 2–4 MiB per long-lived gateway link after some minutes of mixed load (heaptrack: live allocations in
/// `SimulatingDataFramesParserState.accumulate`), the gateway's "step that stays" in docs/soak.md. Given whole
/// frames, the decoder empties its buffer after every read, so the buffer never holds more than one read's worth (the TLS
/// handler's plaintext of one read burst, a few hundred KiB).
///
/// One read per read, not a read per frame or per batch: the decoder appends each read into its buffer, and the DATA
/// payloads it decoded from the previous read are slices of that buffer until the stream channels take them at
/// read-complete. An append while they are held copies the buffer's whole capacity (ByteBuffer's copy-on-write);
/// perf put that at 5 % of the controller's CPU in bulk transfers when reads were split into frame-sized batches. For
/// the same reason a completed held frame is followed by a read-complete before the rest of the read.
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

    /// Header plus the largest payload this side announces: the longest frame.
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
        var completed = false
        guard completePending(context: context, input: &input, completed: &completed) else { return }
        if !passThrough, input.readableBytes > 0 {
            if completed {
                // The decoder keeps the completed frame's DATA payloads as slices of its buffer until the stream
                // channels take them at read-complete; appending more to that shared buffer first would copy all of
                // it (its whole capacity). Letting the streams take them now keeps the next append in place.
                context.fireChannelReadComplete()
            }
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

    /// Moves bytes from `input` into the pending frame; passes it on once whole (setting `completed`). False when
    /// `input` ran out first.
    private func completePending(context: ChannelHandlerContext, input: inout ByteBuffer, completed: inout Bool) -> Bool
    {
        guard var frame = pending else { return true }
        pending = nil  // `frame` is then the buffer's only owner: writing to it does not copy it

        if frame.readableBytes < Self.headerSize {
            var head = input.readSlice(length: min(Self.headerSize - frame.readableBytes, input.readableBytes))!
            frame.writeBuffer(&head)
            guard frame.readableBytes == Self.headerSize else {
                pending = frame
                return false
            }
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
        completed = true
        context.fireChannelRead(wrapInboundOut(frame))
        return true
    }

    /// Passes on the whole frames at the front of `input` in one read: the decoder appends each read to its buffer,
    /// and a second append while the first read's DATA payloads (slices of that buffer) wait for read-complete in
    /// the stream channels would copy the whole buffer.
    private func forwardWholeFrames(context: ChannelHandlerContext, input: inout ByteBuffer) {
        var end = input.readerIndex
        while let length = frameLength(input, at: end) {
            guard length <= batchLimit else {
                passThrough = true
                break
            }
            guard end + length <= input.writerIndex else { break }
            end += length
        }
        guard end > input.readerIndex else { return }
        context.fireChannelRead(wrapInboundOut(input.readSlice(length: end - input.readerIndex)!))
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
