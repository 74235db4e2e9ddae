import ILSCore
import ILSCrypto
import ILSFabric
import ILSTesting
import NIOConcurrencyHelpers
import NIOCore
import NIOPosix
import Testing

/// What a hostile relay (or anyone on the wire between device and gateway) can do to a circuit's frames: replay,
/// reorder, truncate, oversize. Each must end the circuit (fail closed) without the tampered bytes reaching the
/// backend, and the gateway end must keep serving honest circuits afterwards.
@Suite("Hostile bytes on an end-to-end circuit")
struct E2EHostileWireTests {
    /// The largest time a refusal may take on a loaded machine; a healthy run takes milliseconds.
    static let refusalBound: Duration = .seconds(20)

    @Test("a replayed record is refused: the circuit closes and the request is not run twice")
    func duplicatedRecord() async throws {
        try await CircuitFixture.with { fixture in
            let connection = try await fixture.connect(tamper: WireTamper(.duplicate(index: 2)))
            try await connection.send("GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            try await expectClosed(connection)
            #expect(fixture.backend.record.connectionsAccepted <= 1)
            try await expectStillServes(fixture)
        }
    }

    @Test("records swapped in flight are refused before either reaches the backend")
    func reorderedRecords() async throws {
        try await CircuitFixture.with { fixture in
            let connection = try await fixture.connect(tamper: WireTamper(.swap(first: 2)))
            try await connection.send("POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n")
            try await connection.send("0123456789")
            try await expectClosed(connection)
            #expect(fixture.backend.record.connectionsAccepted == 0)
            try await expectStillServes(fixture)
        }
    }

    @Test("a record cut short inside a well-formed frame fails to open and ends the circuit")
    func truncatedRecordInFrame() async throws {
        try await CircuitFixture.with { fixture in
            let connection = try await fixture.connect(tamper: WireTamper(.shorten(index: 2, by: 5)))
            try await connection.send("GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            try await expectClosed(connection)
            #expect(fixture.backend.record.connectionsAccepted == 0)
            try await expectStillServes(fixture)
        }
    }

    @Test("a frame that ends with the connection (truncated on the wire) reaches nothing")
    func truncatedFrameThenEOF() async throws {
        try await CircuitFixture.with { fixture in
            let connection = try await fixture.connect(tamper: WireTamper(.cutThenClose(index: 2, keep: 9)))
            try? await connection.send("GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            try await expectClosed(connection)
            #expect(fixture.backend.record.connectionsAccepted == 0)
            try await expectStillServes(fixture)
        }
    }

    @Test("a record frame announcing more than the 1 MiB limit ends the circuit at once")
    func oversizedRecordFrame() async throws {
        try await oversizedFrame(index: 2)
    }

    @Test("a handshake frame announcing more than the 1 MiB limit ends the circuit at once")
    func oversizedHandshakeFrame() async throws {
        try await oversizedFrame(index: 0)
    }

    private func oversizedFrame(index: Int) async throws {
        try await CircuitFixture.with { fixture in
            let connection = try await fixture.connect(tamper: WireTamper(.oversize(index: index)))
            try? await connection.send("GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            try await expectClosed(connection)
            #expect(fixture.backend.record.connectionsAccepted == 0)
            try await expectStillServes(fixture)
        }
    }

    @Test("a recorded handshake replayed on a new connection, in order or reordered, opens nothing")
    func replayedHandshake() async throws {
        try await CircuitFixture.with { fixture in
            let recorder = WireTamper(.record)
            let original = try await fixture.connect(tamper: recorder)
            try await original.sendRequest("GET", "/health")
            #expect(try await original.readHead().status == 200)
            _ = try await original.readBody()
            await original.close()
            let frames = recorder.recorded
            try #require(frames.count >= 3)
            let accepted = fixture.backend.record.connectionsAccepted

            for order in [[0, 1, 2], [1, 0, 2], [0, 2, 1]] {
                let replay = try await TestHTTPConnection(port: fixture.port)
                for index in order { try? await replay.send(frames[index]) }
                try await expectClosed(replay)
            }
            #expect(fixture.backend.record.connectionsAccepted == accepted)
            try await expectStillServes(fixture)
        }
    }

    @Test("a relay that answers the device's hello with an oversized frame fails the device's circuit at once")
    func oversizedFrameToDevice() async throws {
        let relay = try await ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .childChannelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    try channel.pipeline.syncOperations.addHandler(AnswerWithOversizedFrame())
                }
            }
            .bind(host: "127.0.0.1", port: 0).get()
        let authority = try CertificateAuthority.create(name: "test CA")
        let device = try CircuitFixture.credentials(authority, name: "ipad", role: .device)
        let connection = try await TestHTTPConnection(port: relay.localAddress!.port!) { pipeline in
            try pipeline.addHandler(ByteToMessageHandler(FrameDecoder()))
            try pipeline.addHandler(E2EInitiatorHandler(credentials: device, service: "claude-api"))
        }
        try? await connection.sendRequest("GET", "/health")
        try await expectClosed(connection)
        try? await relay.close()
    }

    private func expectClosed(_ connection: TestHTTPConnection) async throws {
        let closed = try await withThrowingTaskGroup(of: Bool.self) { group in
            group.addTask { await connection.isClosedByPeer() }
            group.addTask {
                try await Task.sleep(for: Self.refusalBound)
                return false
            }
            let first = try await group.next()!
            group.cancelAll()
            return first
        }
        #expect(closed, "the circuit stayed open after hostile bytes")
        await connection.close()
    }

    private func expectStillServes(_ fixture: CircuitFixture) async throws {
        let connection = try await fixture.connect()
        try await connection.sendRequest("GET", "/health")
        #expect(try await connection.readHead().status == 200)
        #expect(String(buffer: try await connection.readBody()) == "ok")
        await connection.close()
    }
}

/// A hostile relay that answers whatever the device sends first with a frame announcing 0x7FFF_FFFF bytes.
final class AnswerWithOversizedFrame: ChannelInboundHandler, Sendable {
    typealias InboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        var huge = context.channel.allocator.buffer(capacity: 16)
        huge.writeInteger(UInt32(0x7FFF_FFFF))
        huge.writeBytes([2, 1, 0, 0, 0, 0, 0, 0])
        context.writeAndFlush(wrapOutboundOut(huge), promise: nil)
    }
}

/// Plays a hostile relay on the device's side of the wire, on whole outgoing frames (the end-to-end handlers write
/// one frame per write: 0 is ClientHello, 1 ClientFinished, 2 and later are records).
final class WireTamper: ChannelOutboundHandler, Sendable {
    typealias OutboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer

    enum Action: Sendable {
        /// Keep a copy of every frame, change nothing.
        case record
        /// Send frame `index` twice.
        case duplicate(index: Int)
        /// Hold frame `first` back and send it after the next one.
        case swap(first: Int)
        /// Drop the last `by` bytes of frame `index`'s body and fix its length prefix to match.
        case shorten(index: Int, by: Int)
        /// Send only the first `keep` bytes of frame `index`, then close the connection.
        case cutThenClose(index: Int, keep: Int)
        /// Replace frame `index` with a prefix announcing 0x7FFF_FFFF bytes and a few bytes of body.
        case oversize(index: Int)
    }

    private struct State {
        var seen = 0
        var held: (ByteBuffer, EventLoopPromise<Void>?)?
        var recorded: [ByteBuffer] = []
    }

    private let action: Action
    private let state = NIOLockedValueBox(State())

    init(_ action: Action) { self.action = action }

    var recorded: [ByteBuffer] { state.withLockedValue { $0.recorded } }

    func write(context: ChannelHandlerContext, data: NIOAny, promise: EventLoopPromise<Void>?) {
        var buffer = unwrapOutboundIn(data)
        let index = state.withLockedValue { state in
            defer { state.seen += 1 }
            return state.seen
        }
        switch action {
        case .record:
            state.withLockedValue { $0.recorded.append(buffer) }
        case .duplicate(let target) where target == index:
            context.write(wrapOutboundOut(buffer), promise: nil)
        case .swap(let first) where first == index:
            state.withLockedValue { $0.held = (buffer, promise) }
            return
        case .swap(let first) where first + 1 == index:
            context.write(wrapOutboundOut(buffer), promise: promise)
            if let (held, heldPromise) = state.withLockedValue({ $0.held }) {
                context.write(wrapOutboundOut(held), promise: heldPromise)
            }
            return
        case .shorten(let target, let by) where target == index:
            let length = Int(buffer.getInteger(at: buffer.readerIndex, as: UInt32.self)!)
            buffer.setInteger(UInt32(length - by), at: buffer.readerIndex)
            buffer.moveWriterIndex(to: buffer.writerIndex - by)
        case .cutThenClose(let target, let keep) where target == index:
            let cut = buffer.getSlice(at: buffer.readerIndex, length: keep)!
            let channel = context.channel
            context.writeAndFlush(wrapOutboundOut(cut)).whenComplete { _ in channel.close(promise: nil) }
            promise?.succeed()
            return
        case .oversize(let target) where target == index:
            var huge = context.channel.allocator.buffer(capacity: 16)
            huge.writeInteger(UInt32(0x7FFF_FFFF))
            huge.writeBytes([1, 1, 0, 0, 0, 0, 0, 0])
            buffer = huge
        default:
            break
        }
        context.write(wrapOutboundOut(buffer), promise: promise)
    }
}
