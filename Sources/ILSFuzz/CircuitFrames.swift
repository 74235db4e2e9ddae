import ILSFabric
import NIOCore
import NIOEmbedded

/// Splits circuit bytes into frame bodies with the real `FrameDecoder`, as a circuit's pipeline does.
enum CircuitFrames {
    /// The frame bodies in `bytes`, up to the first framing error or the incomplete tail.
    static func decode(_ bytes: UnsafeRawBufferPointer) -> [ByteBuffer] {
        let channel = EmbeddedChannel(handler: ByteToMessageHandler(FrameDecoder()))
        defer { _ = try? channel.finish(acceptAlreadyClosed: true) }
        _ = try? channel.writeInbound(ByteBuffer(bytes: bytes))
        var frames: [ByteBuffer] = []
        while let frame = try? channel.readInbound(as: ByteBuffer.self) { frames.append(frame) }
        return frames
    }

    /// `messages` framed for the wire (`u32 length ‖ body`), for seeds.
    static func encode(_ messages: [[UInt8]]) -> [UInt8] {
        var buffer = ByteBuffer()
        for message in messages {
            buffer.writeInteger(UInt32(message.count))
            buffer.writeBytes(message)
        }
        return Array(buffer.readableBytesView)
    }
}
