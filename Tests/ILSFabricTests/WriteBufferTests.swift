import ILSFabric
import ILSSplice
import NIOCore
import NIOEmbedded
import NIOHTTP2
import Testing

/// A circuit's channels must take a whole end-to-end record without turning unwritable: with NIO's defaults (about
/// 8 KiB for an HTTP/2 stream) every record stopped the reads on the other side of the splice and a bulk transfer
/// ran in stop-and-go.
@Suite("Write buffers on a circuit's path")
struct WriteBufferTests {
    @Test("an overlay stream stays writable with two whole records written and not yet sent")
    func streamTakesRecords() throws {
        let channel = EmbeddedChannel()
        defer { _ = try? channel.finish() }
        let multiplexer = try channel.pipeline.syncOperations.configureFabricHTTP2(mode: .client)
        try channel.connect(to: SocketAddress(ipAddress: "127.0.0.1", port: 1)).wait()
        let created = channel.eventLoop.makePromise(of: (any Channel).self)
        multiplexer.createStreamChannel(promise: created) { stream in stream.eventLoop.makeSucceededVoidFuture() }
        channel.embeddedEventLoop.run()
        let stream = try created.futureResult.wait()
        let record = ByteBuffer(repeating: 0xAB, count: 4 + RecordLimits.maximumPlaintext + 17)
        for _ in 0..<2 {
            stream.write(HTTP2Frame.FramePayload.data(.init(data: .byteBuffer(record))), promise: nil)
        }
        channel.embeddedEventLoop.run()
        #expect(stream.isWritable)
        #expect(WriteBuffers.stream.high >= 2 * record.readableBytes)
        #expect(WriteBuffers.overlayConnection.high >= 2 * record.readableBytes)
        #expect(WriteBuffers.localConnection.high >= 2 * RecordLimits.maximumPlaintext)
    }
}
