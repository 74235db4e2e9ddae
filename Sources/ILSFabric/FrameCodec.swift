public import NIOCore

/// The circuit framing: every handshake message and every encrypted record travels as `u32 length ‖ body`
/// (big-endian), so record boundaries survive any transport that splits or merges bytes.
///
/// Bodies are bounded: a peer that announces more than `maximumBodyLength` is cut off before anything is buffered.
/// The sending side frames in the end-to-end handlers themselves (`E2ERecordLayer`), sealing each record straight
/// into its framed wire buffer.
public final class FrameDecoder: ByteToMessageDecoder {
    public typealias InboundOut = ByteBuffer

    /// Large enough for the biggest record (`RecordLimits.maximumPlaintext` plus overhead) and any handshake message.
    public static let maximumBodyLength = 1 << 20

    public init() {}

    public func decode(context: ChannelHandlerContext, buffer: inout ByteBuffer) throws -> DecodingState {
        guard let length = buffer.getInteger(at: buffer.readerIndex, as: UInt32.self) else { return .needMoreData }
        guard length <= Self.maximumBodyLength else { throw FrameError.tooLarge(Int(length)) }
        guard buffer.readableBytes >= 4 + Int(length) else { return .needMoreData }
        buffer.moveReaderIndex(forwardBy: 4)
        context.fireChannelRead(wrapInboundOut(buffer.readSlice(length: Int(length))!))
        return .continue
    }
}

public enum FrameError: Error, Equatable {
    case tooLarge(Int)
}

/// How much plaintext one record carries. Bulk transfers fill records up to the maximum; an interactive write (an
/// SSE event) becomes a record of its own, so it is never held back waiting for more.
public enum RecordLimits {
    public static let maximumPlaintext = 64 * 1024
}
