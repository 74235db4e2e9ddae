import ILSCore
import ILSCrypto
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

extension RecordBatchTests {
    @Test(
        "bytes written without a flush still go, before the FINAL record, when the device half-closes (also before the handshake is done)",
        arguments: [true, false]
    )
    func halfCloseSendsWhatWaits(handshakeFirst: Bool) throws {
        let received = NIOLockedValueBox((bytes: "", ended: false))
        let (device, gateway) = try Self.connectedEnds(received: received, deviceFirst: [StreamEnd()])
        defer {
            _ = try? device.finish()
            _ = try? gateway.finish()
        }
        // Before the handshake is done, the device's writes and its half-close are held for it (the tunnel reads a
        // client's request and end of file together, while the handshake's round trip is still out).
        if handshakeFirst { try Self.pump(device, gateway) }
        device.write(ByteBuffer(string: "hello, "), promise: nil)
        device.write(ByteBuffer(string: "gateway"), promise: nil)
        // The half-close succeeds; a write after it fails (as on a socket) and sends nothing.
        let outcomes = NIOLockedValueBox((halfClose: "pending", late: "pending"))
        let halfClosed = device.eventLoop.makePromise(of: Void.self)
        halfClosed.futureResult.whenComplete { result in
            outcomes.withLockedValue { $0.halfClose = (try? result.get()) != nil ? "succeeded" : "failed" }
        }
        device.close(mode: .output, promise: halfClosed)
        let late = device.eventLoop.makePromise(of: Void.self)
        late.futureResult.whenComplete { result in
            outcomes.withLockedValue { $0.late = (try? result.get()) != nil ? "succeeded" : "failed" }
        }
        device.writeAndFlush(ByteBuffer(string: "after the end"), promise: late)
        try Self.pump(device, gateway)
        device.embeddedEventLoop.run()
        #expect(received.withLockedValue { $0.bytes } == "hello, gateway")
        #expect(received.withLockedValue { $0.ended })
        #expect(outcomes.withLockedValue { $0.halfClose } == "succeeded")
        #expect(outcomes.withLockedValue { $0.late } == "failed")
    }

    @Test("a bulk write seals into records whose buffers are 64 KiB at most, so a kept record costs what it carries")
    func fullRecordsFitAPowerOfTwo() throws {
        let received = NIOLockedValueBox((bytes: "", ended: false))
        let (device, gateway) = try Self.connectedEnds(received: received)
        defer {
            _ = try? device.finish()
            _ = try? gateway.finish()
        }
        try Self.pump(device, gateway)
        let size = 3 * RecordLimits.maximumPlaintext
        device.writeAndFlush(ByteBuffer(repeating: 0x5A, count: size), promise: nil)
        var records: [ByteBuffer] = []
        while let frame = try device.readOutbound(as: ByteBuffer.self) { records.append(frame) }
        // NIO rounds a buffer up to a power of two: a record of 64 KiB of plaintext would take 128 KiB, which a
        // resumable circuit keeps (and counts) until the peer acknowledges it.
        #expect(records.map(\.readableBytes).max() == 64 * 1024)
        #expect(records.allSatisfy { $0.capacity <= 64 * 1024 }, "\(records.map(\.capacity))")
        #expect(records.count == (size + RecordLimits.sealedPlaintext - 1) / RecordLimits.sealedPlaintext)
        for record in records { try gateway.writeInbound(record) }
        #expect(received.withLockedValue { $0.bytes.utf8.count } == size)
    }

    /// A device and a gateway end on one embedded loop, connected, the handshake not begun (`pump` runs it); what
    /// the gateway's side hands up goes to `received`. `deviceFirst` goes in front of the device's handlers.
    static func connectedEnds(
        received: NIOLockedValueBox<(bytes: String, ended: Bool)>,
        deviceFirst: [any ChannelHandler] = []
    ) throws -> (device: EmbeddedChannel, gateway: EmbeddedChannel) {
        let authority = try CertificateAuthority.create(name: "test CA")
        let device = EmbeddedChannel(
            handlers: deviceFirst + [
                ByteToMessageHandler(FrameDecoder()),
                E2EInitiatorHandler(
                    credentials: try TestIdentities.credentials(authority, name: "ipad", role: .device),
                    service: "claude-api"
                ),
            ]
        )
        let gateway = EmbeddedChannel(
            handlers: [
                ByteToMessageHandler(FrameDecoder()),
                E2EResponderHandler(
                    credentials: try TestIdentities.credentials(authority, name: "gw", role: .gateway),
                    authorize: { _, _ in .allow },
                    onEstablished: { channel, _ in
                        try channel.pipeline.syncOperations.addHandler(Collector(received: received))
                    }
                ),
            ],
            loop: device.embeddedEventLoop
        )
        try device.connect(to: SocketAddress(ipAddress: "127.0.0.1", port: 1)).wait()
        try gateway.connect(to: SocketAddress(ipAddress: "127.0.0.1", port: 2)).wait()
        return (device, gateway)
    }

    /// Moves bytes both ways until neither side has anything left to send.
    static func pump(_ first: EmbeddedChannel, _ second: EmbeddedChannel) throws {
        var moved = true
        while moved {
            moved = false
            while let bytes = try first.readOutbound(as: ByteBuffer.self) {
                try second.writeInbound(bytes)
                moved = true
            }
            while let bytes = try second.readOutbound(as: ByteBuffer.self) {
                try first.writeInbound(bytes)
                moved = true
            }
        }
    }

    /// Takes the half-close that follows the FINAL record as an HTTP/2 stream does (`StreamDataCodec`: END_STREAM,
    /// the stream stays open for the other direction); an embedded channel would close altogether.
    final class StreamEnd: ChannelOutboundHandler {
        typealias OutboundIn = ByteBuffer

        func close(context: ChannelHandlerContext, mode: CloseMode, promise: EventLoopPromise<Void>?) {
            if mode == .output {
                promise?.succeed()
            } else {
                context.close(mode: mode, promise: promise)
            }
        }
    }

    /// What the gateway's side of the circuit hands up: the plaintext, and whether the FINAL record came.
    final class Collector: ChannelInboundHandler {
        typealias InboundIn = ByteBuffer
        let received: NIOLockedValueBox<(bytes: String, ended: Bool)>

        init(received: NIOLockedValueBox<(bytes: String, ended: Bool)>) { self.received = received }

        func channelRead(context: ChannelHandlerContext, data: NIOAny) {
            let text = String(buffer: unwrapInboundIn(data))
            received.withLockedValue { $0.bytes += text }
        }

        func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
            if case ChannelEvent.inputClosed = event { received.withLockedValue { $0.ended = true } }
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
        // An ACK record (flags 0x04, 8 bytes sealed: suite 5) is no part of the answer; the gateway sends one a
        // second after the request if nothing else acknowledged it.
        let frame = unwrapInboundIn(data)
        let isAck = frame.readableBytes == E2ERecord.overhead + 8 && frame.getInteger(at: frame.readerIndex) == UInt8(4)
        if !isAck { count.withLockedValue { $0 += 1 } }
        context.fireChannelRead(data)
    }
}
