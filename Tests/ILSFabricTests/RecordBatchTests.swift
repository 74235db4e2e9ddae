import ILSFabric
import ILSTesting
import NIOConcurrencyHelpers
import NIOCore
import NIOEmbedded
import Testing

/// Writes made between two flushes are sealed as one end-to-end record; bulk writes are sealed alone, uncopied.
@Suite("Record batching")
struct RecordBatchTests {
    let allocator = ByteBufferAllocator()

    @Test("small writes wait for the drain and come out as one buffer, in order")
    func smallWritesJoin() {
        var batch = RecordBatch()
        for piece in ["HTTP/1.1 200 OK\r\n\r\n", "data: 1\n\n", ""] {
            let (waiting, alone) = batch.add(ByteBuffer(string: piece), promise: nil, allocator: allocator)
            #expect(waiting == nil && alone == nil)
        }
        #expect(batch.drain().map { String(buffer: $0.plaintext) } == "HTTP/1.1 200 OK\r\n\r\ndata: 1\n\n")
        #expect(batch.drain() == nil)
    }

    @Test("an empty write with nothing waiting seals nothing; with a promise it keeps its place")
    func emptyWrites() {
        var batch = RecordBatch()
        let (waiting, alone) = batch.add(ByteBuffer(), promise: nil, allocator: allocator)
        #expect(waiting == nil && alone == nil && batch.drain() == nil)
        let loop = EmbeddedEventLoop()
        let promise = loop.makePromise(of: Void.self)
        let (_, withPromise) = batch.add(ByteBuffer(), promise: promise, allocator: allocator)
        #expect(withPromise?.promise?.futureResult === promise.futureResult)
        promise.succeed()
    }

    @Test("a bulk write goes alone and uncopied, after what waits")
    func bulkWriteAlone() {
        var batch = RecordBatch()
        _ = batch.add(ByteBuffer(string: "head"), promise: nil, allocator: allocator)
        let bulk = ByteBuffer(repeating: 7, count: RecordBatch.sealedAlone)
        let (waiting, alone) = batch.add(bulk, promise: nil, allocator: allocator)
        #expect(waiting.map { String(buffer: $0.plaintext) } == "head")
        #expect(alone?.plaintext == bulk)
        bulk.withUnsafeReadableBytes { original in
            alone!.plaintext.withUnsafeReadableBytes { passed in #expect(original.baseAddress == passed.baseAddress) }
        }
        #expect(batch.drain() == nil)
    }

    @Test("a batch never outgrows one record")
    func boundedByRecord() {
        var batch = RecordBatch()
        let piece = ByteBuffer(repeating: 1, count: RecordBatch.sealedAlone - 1)
        var sealed: [Int] = []
        for _ in 0..<10 {
            if let waiting = batch.add(piece, promise: nil, allocator: allocator).waiting {
                sealed.append(waiting.plaintext.readableBytes)
            }
        }
        if let rest = batch.drain() { sealed.append(rest.plaintext.readableBytes) }
        #expect(sealed.allSatisfy { $0 <= RecordLimits.maximumPlaintext })
        #expect(sealed.reduce(0, +) == 10 * piece.readableBytes)
    }

    @Test("the promises of joined writes complete with the record's write, or fail with the batch")
    func promises() {
        let loop = EmbeddedEventLoop()
        var batch = RecordBatch()
        let first = loop.makePromise(of: Void.self)
        let second = loop.makePromise(of: Void.self)
        _ = batch.add(ByteBuffer(string: "a"), promise: first, allocator: allocator)
        _ = batch.add(ByteBuffer(string: "b"), promise: second, allocator: allocator)
        let completed = NIOLockedValueBox(0)
        second.futureResult.whenSuccess { completed.withLockedValue { $0 += 1 } }
        batch.drain()?.promise?.succeed()
        loop.run()
        #expect(completed.withLockedValue { $0 } == 1)

        let dropped = loop.makePromise(of: Void.self)
        _ = batch.add(ByteBuffer(string: "c"), promise: dropped, allocator: allocator)
        let failed = NIOLockedValueBox(false)
        dropped.futureResult.whenFailure { _ in failed.withLockedValue { $0 = true } }
        batch.fail(ChannelError.ioOnClosedChannel)
        loop.run()
        #expect(failed.withLockedValue { $0 } && batch.drain() == nil)
    }

    @Test("a response written as head, body and end crosses the circuit as one record")
    func responseIsOneRecord() async throws {
        try await CircuitFixture.with { fixture in
            let counter = FrameCounter()
            let connection = try await TestHTTPConnection(port: fixture.port) { pipeline in
                try pipeline.addHandler(ByteToMessageHandler(FrameDecoder()))
                try pipeline.addHandler(counter)
                try pipeline.addHandler(E2EInitiatorHandler(credentials: fixture.device, service: "claude-api"))
            }
            try await connection.sendRequest("GET", "/health")
            #expect(try await connection.readHead().status == 200)
            #expect(String(buffer: try await connection.readBody()) == "ok")
            // The gateway's ServerHello, then one record for the whole response.
            #expect(counter.frames == 2)
            await connection.close()
        }
    }
}

/// Counts the frames (handshake messages and records) arriving at the device.
final class FrameCounter: ChannelInboundHandler, Sendable {
    typealias InboundIn = ByteBuffer
    typealias InboundOut = ByteBuffer
    private let count = NIOLockedValueBox(0)

    var frames: Int { count.withLockedValue { $0 } }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        count.withLockedValue { $0 += 1 }
        context.fireChannelRead(data)
    }
}
