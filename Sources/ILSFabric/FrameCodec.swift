import ILSCrypto
public import NIOCore

/// The circuit framing: every handshake message and every encrypted record travels as `u32 length ‖ body`
/// (big-endian), so record boundaries survive any transport that splits or merges bytes.
///
/// Bodies are bounded: a peer that announces more than `maximumBodyLength` is cut off before anything is buffered.
/// The sending side frames in the end-to-end handlers themselves (`E2ERecordLayer`), sealing each record straight
/// into its framed wire buffer.
///
/// Whole frames go on as slices of what arrived, with no copy: a DATA frame normally carries exactly one record, so
/// the usual case copies nothing. Only the start of a frame whose end has not arrived is copied, once, into a buffer
/// of its own sized for the whole frame: a slice would keep the HTTP/2 decoder's whole read buffer (hundreds of KiB)
/// alive for as long as the frame stays incomplete, per circuit, and make the decoder copy that buffer on its next
/// read.
public final class FrameDecoder: ByteToMessageDecoder {
    public typealias InboundOut = ByteBuffer

    /// Large enough for the biggest record (`RecordLimits.maximumPlaintext` plus overhead) and any handshake message.
    public static let maximumBodyLength = 1 << 20

    /// Whether the incomplete frame being held is already in a buffer of its own (the decoder appends what follows
    /// into it).
    private var holdingOwnCopy = false

    public init() {}

    public func decode(context: ChannelHandlerContext, buffer: inout ByteBuffer) throws -> DecodingState {
        guard let length = buffer.getInteger(at: buffer.readerIndex, as: UInt32.self) else {
            hold(&buffer, frameLength: 4, allocator: context.channel.allocator)
            return .needMoreData
        }
        guard length <= Self.maximumBodyLength else { throw FrameError.tooLarge(Int(length)) }
        guard buffer.readableBytes >= 4 + Int(length) else {
            hold(&buffer, frameLength: 4 + Int(length), allocator: context.channel.allocator)
            return .needMoreData
        }
        holdingOwnCopy = false
        buffer.moveReaderIndex(forwardBy: 4)
        context.fireChannelRead(wrapInboundOut(buffer.readSlice(length: Int(length))!))
        return .continue
    }

    /// Moves the start of an incomplete frame into a buffer of its own, the first time it is held.
    private func hold(_ buffer: inout ByteBuffer, frameLength: Int, allocator: ByteBufferAllocator) {
        guard !holdingOwnCopy, buffer.readableBytes > 0 else { return }
        var own = allocator.buffer(capacity: max(frameLength, buffer.readableBytes))
        own.writeImmutableBuffer(buffer)
        buffer = own
        holdingOwnCopy = frameLength > 4
    }
}

public enum FrameError: Error, Equatable {
    case tooLarge(Int)
}

/// How much plaintext one record carries. Bulk transfers fill records up to the maximum; an interactive write (an
/// SSE event) becomes a record of its own, so it is never held back waiting for more.
public enum RecordLimits {
    /// The most a record may carry: a receiver refuses more (docs/protocol.md).
    public static let maximumPlaintext = 64 * 1024
    /// The most this implementation puts in one record: a full record then frames (4-byte length, plaintext,
    /// `E2ERecord.overhead`) to exactly 64 KiB. NIO's allocator rounds a buffer up to a power of two, so a record of
    /// `maximumPlaintext` would take a 128 KiB buffer; a resumable circuit keeps each record's buffer until the peer
    /// acknowledges it and counts its capacity against its bound (`CircuitRetention`), so a full record of 64 KiB
    /// would halve the data in flight and the throughput with it.
    public static let sealedPlaintext = 64 * 1024 - 4 - E2ERecord.overhead
}
