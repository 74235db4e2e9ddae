import ILSFabric
import NIOCore
import NIOEmbedded
import NIOHPACK
import NIOHTTP2
import Testing

/// `TLSRecordCoalescer` hands the TLS handler (one record per write) each flush's small writes as one buffer, so an
/// HTTP/2 frame is one record, not a header record and a payload record.
@Suite("TLS record coalescing in front of the TLS handler")
struct TLSRecordCoalescerTests {
    @Test("the writes of one flush reach the next handler as one buffer, in order, and only at the flush")
    func mergesOneFlush() throws {
        let channel = EmbeddedChannel(handler: TLSRecordCoalescer())
        try channel.connect(to: SocketAddress(ipAddress: "127.0.0.1", port: 1)).wait()
        channel.write(ByteBuffer(bytes: [1, 2, 3]), promise: nil)
        channel.write(ByteBuffer(bytes: [4]), promise: nil)
        channel.write(ByteBuffer(bytes: [5, 6]), promise: nil)
        #expect(try channel.readOutbound(as: ByteBuffer.self) == nil, "a write went out before its flush")
        channel.flush()
        #expect(try channel.readOutbound(as: ByteBuffer.self) == ByteBuffer(bytes: [1, 2, 3, 4, 5, 6]))
        #expect(try channel.readOutbound(as: ByteBuffer.self) == nil)
        _ = try channel.finish()
    }

    @Test("a write too large for one record goes out on its own, between the runs before and after it")
    func largeWriteAlone() throws {
        let channel = EmbeddedChannel(handler: TLSRecordCoalescer(recordLimit: 10))
        try channel.connect(to: SocketAddress(ipAddress: "127.0.0.1", port: 1)).wait()
        let large = ByteBuffer(repeating: 9, count: 25)
        let writes = [
            ByteBuffer(bytes: [1, 2]), ByteBuffer(bytes: [3]), large, ByteBuffer(bytes: [4]),
            ByteBuffer(repeating: 5, count: 9), ByteBuffer(bytes: [6]),
        ]
        for write in writes { channel.write(write, promise: nil) }
        channel.flush()
        var out: [ByteBuffer] = []
        while let buffer = try channel.readOutbound(as: ByteBuffer.self) { out.append(buffer) }
        #expect(
            out == [
                ByteBuffer(bytes: [1, 2, 3]), large, ByteBuffer(bytes: [4, 5, 5, 5, 5, 5, 5, 5, 5, 5]),
                ByteBuffer(bytes: [6]),
            ]
        )
        _ = try channel.finish()
    }

    @Test("every merged write's promise completes when the merged write does, and fails with it")
    func promisesFollowTheMergedWrite() throws {
        let below = WriteRecorder()
        let channel = EmbeddedChannel(handlers: [below, TLSRecordCoalescer()])
        try channel.connect(to: SocketAddress(ipAddress: "127.0.0.1", port: 1)).wait()
        let first = channel.eventLoop.makePromise(of: Void.self)
        let second = channel.eventLoop.makePromise(of: Void.self)
        channel.write(ByteBuffer(bytes: [1]), promise: first)
        channel.write(ByteBuffer(bytes: [2]), promise: nil)
        channel.write(ByteBuffer(bytes: [3]), promise: second)
        channel.flush()
        #expect(below.writes == [ByteBuffer(bytes: [1, 2, 3])])
        below.completeAll(with: .success(()))
        try first.futureResult.wait()
        try second.futureResult.wait()

        // Unflushed writes at close are passed on (merged) before the close, so they fail as the TLS handler fails
        // them, every promise with them.
        let failed = channel.eventLoop.makePromise(of: Void.self)
        let alsoFailed = channel.eventLoop.makePromise(of: Void.self)
        channel.write(ByteBuffer(bytes: [4]), promise: failed)
        channel.write(ByteBuffer(bytes: [5]), promise: alsoFailed)
        #expect(below.writes == [ByteBuffer(bytes: [1, 2, 3])], "a write went out before its flush")
        channel.close(promise: nil)
        #expect(below.writes == [ByteBuffer(bytes: [1, 2, 3]), ByteBuffer(bytes: [4, 5])])
        #expect(throws: ChannelError.self) { try failed.futureResult.wait() }
        #expect(throws: ChannelError.self) { try alsoFailed.futureResult.wait() }
        _ = try channel.finish(acceptAlreadyClosed: true)
    }

    @Test("writes held when the handler is removed are passed on, none lost")
    func removalPassesWritesOn() throws {
        let coalescer = TLSRecordCoalescer()
        let channel = EmbeddedChannel(handler: coalescer)
        try channel.connect(to: SocketAddress(ipAddress: "127.0.0.1", port: 1)).wait()
        channel.write(ByteBuffer(bytes: [1]), promise: nil)
        channel.write(ByteBuffer(bytes: [2]), promise: nil)
        try channel.pipeline.syncOperations.removeHandler(coalescer).wait()
        channel.flush()
        var received: [UInt8] = []
        while var buffer = try channel.readOutbound(as: ByteBuffer.self) {
            received += buffer.readBytes(length: buffer.readableBytes)!
        }
        #expect(received == [1, 2])
        _ = try channel.finish()
    }

    @Test("on an overlay connection a small DATA frame and its HEADERS leave as one buffer, a large payload uncopied")
    func fabricConnectionWritesOneBufferPerFlush() throws {
        let channel = EmbeddedChannel()
        let multiplexer = try channel.pipeline.syncOperations.configureFabricHTTP2(mode: .client)
        try channel.connect(to: SocketAddress(ipAddress: "127.0.0.1", port: 1)).wait()
        while try channel.readOutbound(as: ByteBuffer.self) != nil {}  // preface and SETTINGS

        let streamPromise = channel.eventLoop.makePromise(of: (any Channel).self)
        multiplexer.createStreamChannel(promise: streamPromise) { $0.eventLoop.makeSucceededVoidFuture() }
        channel.embeddedEventLoop.run()
        let stream = try streamPromise.futureResult.wait()
        let headers = HPACKHeaders([(":method", "GET"), (":path", "/"), (":scheme", "https"), (":authority", "x")])
        stream.write(HTTP2Frame.FramePayload.headers(.init(headers: headers)), promise: nil)
        let small = ByteBuffer(repeating: 7, count: 1024)
        stream.write(HTTP2Frame.FramePayload.data(.init(data: .byteBuffer(small))), promise: nil)
        stream.flush()
        channel.embeddedEventLoop.run()
        var buffers: [ByteBuffer] = []
        while let buffer = try channel.readOutbound(as: ByteBuffer.self) { buffers.append(buffer) }
        #expect(buffers.count == 1, "one flush of two frames left as \(buffers.count) writes (records)")
        // HEADERS and DATA (and the WINDOW_UPDATEs the fabric's larger windows announce with the first stream), whole.
        let types = Self.frameTypes(buffers.first ?? ByteBuffer())
        #expect(types.prefix(2) == [1, 0] && types.dropFirst(2).allSatisfy { $0 == 8 }, "frames: \(types)")

        // A payload of one whole record (the largest frame before the peer's SETTINGS raise it) is not copied.
        let payload = ByteBuffer(repeating: 8, count: TLSRecordCoalescer.recordLimit)
        stream.writeAndFlush(HTTP2Frame.FramePayload.data(.init(data: .byteBuffer(payload))), promise: nil)
        channel.embeddedEventLoop.run()
        buffers = []
        while let buffer = try channel.readOutbound(as: ByteBuffer.self) { buffers.append(buffer) }
        #expect(buffers.map(\.readableBytes) == [9, payload.readableBytes], "a payload above one record was merged")
        _ = try? channel.finish()
    }

    /// Stands in for the TLS handler: records each write; completes the promises when told, fails them at close.
    final class WriteRecorder: ChannelOutboundHandler, @unchecked Sendable {
        typealias OutboundIn = ByteBuffer
        private(set) var writes: [ByteBuffer] = []
        private var promises: [EventLoopPromise<Void>] = []

        func write(context: ChannelHandlerContext, data: NIOAny, promise: EventLoopPromise<Void>?) {
            writes.append(unwrapOutboundIn(data))
            if let promise { promises.append(promise) }
        }

        func flush(context: ChannelHandlerContext) {}

        func close(context: ChannelHandlerContext, mode: CloseMode, promise: EventLoopPromise<Void>?) {
            completeAll(with: .failure(ChannelError.ioOnClosedChannel))
            context.close(mode: mode, promise: promise)
        }

        func completeAll(with result: Result<Void, any Error>) {
            let waiting = promises
            promises = []
            for promise in waiting { promise.completeWith(result) }
        }
    }

    /// The frame types in `buffer`, which must hold whole frames.
    static func frameTypes(_ buffer: ByteBuffer) -> [UInt8] {
        var buffer = buffer
        var types: [UInt8] = []
        while buffer.readableBytes >= 9, let length = buffer.getInteger(at: buffer.readerIndex, as: UInt32.self) {
            let payload = Int(length >> 8)
            types.append(buffer.getInteger(at: buffer.readerIndex + 3, as: UInt8.self)!)
            buffer.moveReaderIndex(forwardBy: min(buffer.readableBytes, 9 + payload))
        }
        return buffer.readableBytes == 0 ? types : types + [0xFF]
    }
}
