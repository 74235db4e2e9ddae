import ILSTesting
import NIOConcurrencyHelpers
import NIOCore
import NIOEmbedded
import NIOHTTP2
import Testing

@testable import ILSFabric

/// A circuit that ends abortively resets its stream, and the reset must not overtake what the circuit wrote before
/// it: swift-nio-http2 keeps a stream's DATA in its flow-control buffer while the connection is not writable, and a
/// RST_STREAM discards that buffer. Under load the CANCEL record that tells the peer "ended on purpose, do not
/// resume" was lost that way, and the device tried to resume a circuit the gateway had ended.
@Suite("A circuit's reset follows what it wrote")
struct CircuitResetTests {
    /// What the peer's end of the stream saw, in order.
    final class Seen: ChannelInboundHandler, Sendable {
        typealias InboundIn = HTTP2Frame.FramePayload
        let events = NIOLockedValueBox<[String]>([])
        /// The peer's end of the stream, to send on. Weak: the stream's pipeline holds this handler, and a strong
        /// reference back made a cycle that LeakSanitizer reported.
        private let weakStream = NIOLockedValueBox(WeakChannel())
        var stream: (any Channel)? { weakStream.withLockedValue { $0.channel } }

        /// Read and written only under `weakStream`'s lock.
        final class WeakChannel: @unchecked Sendable {
            weak var channel: (any Channel)?
        }

        func handlerAdded(context: ChannelHandlerContext) {
            weakStream.withLockedValue { $0.channel = context.channel }
        }

        func channelRead(context: ChannelHandlerContext, data: NIOAny) {
            guard case .data(let payload) = unwrapInboundIn(data), case .byteBuffer(let bytes) = payload.data else {
                return
            }
            events.withLockedValue {
                if bytes.readableBytes > 0 { $0.append(String(buffer: bytes)) }
                if payload.endStream { $0.append("END_STREAM") }
            }
        }

        func errorCaught(context: ChannelHandlerContext, error: any Error) {
            if let closed = error as? NIOHTTP2Errors.StreamClosed, closed.errorCode == .cancel {
                events.withLockedValue { $0.append("RST_STREAM") }
            }
        }
    }

    /// A device's connection and the controller's end of it, on one embedded loop; a circuit on a stream of it.
    struct Link {
        let loop = EmbeddedEventLoop()
        let device: EmbeddedChannel
        let controller: EmbeddedChannel
        let seen = Seen()
        let circuit: CircuitChannel
        let multiplexer: NIOHTTP2Handler.StreamMultiplexer

        init(retention: CircuitRetention = CircuitRetention()) throws {
            device = EmbeddedChannel(loop: loop)
            controller = EmbeddedChannel(loop: loop)
            let seen = self.seen
            _ = try controller.pipeline.syncOperations.configureFabricHTTP2(mode: .server) { seen }
            multiplexer = try device.pipeline.syncOperations.configureFabricHTTP2(mode: .client)
            let address = try SocketAddress(ipAddress: "127.0.0.1", port: 1)
            device.connect(to: address, promise: nil)
            controller.connect(to: address, promise: nil)
            try exchangeBytes(device, controller)

            let path = try Self.newPath(multiplexer, loop: loop)
            circuit = CircuitChannel(eventLoop: loop, allocator: path.channel!.allocator, retention: retention)
            circuit.start(on: path)
            try exchangeBytes(device, controller)
        }

        /// A new stream of the device's connection with a path handler on it (a resumption's path), its CONNECT
        /// sent.
        func newPath() throws -> CircuitPathHandler {
            let path = try Self.newPath(multiplexer, loop: loop)
            try exchangeBytes(device, controller)
            return path
        }

        private static func newPath(
            _ multiplexer: NIOHTTP2Handler.StreamMultiplexer,
            loop: EmbeddedEventLoop
        ) throws -> CircuitPathHandler {
            let created = multiplexer.createStreamChannel { $0.eventLoop.makeSucceededVoidFuture() }
            loop.run()
            var made: (any Channel)?
            created.whenSuccess { made = $0 }
            let stream = try #require(made)
            stream.writeAndFlush(
                HTTP2Frame.FramePayload.headers(.init(headers: [":method": "CONNECT", ":authority": "claude-api"])),
                promise: nil
            )
            let path = CircuitPathHandler()
            try stream.pipeline.syncOperations.addHandlers(StreamDataCodec(), path)
            return path
        }

        /// The device's connection stops (`false`) or starts again taking writes, as a full socket buffer does.
        func connectionWritable(_ writable: Bool) {
            device.isWritable = writable
            device.pipeline.fireChannelWritabilityChanged()
        }

        func finish() {
            _ = try? device.finish(acceptAlreadyClosed: true)
            _ = try? controller.finish(acceptAlreadyClosed: true)
        }
    }

    @Test("a circuit reset while its connection is not writable sends its last record first, then the reset")
    func resetWaitsForTheLastRecord() throws {
        let link = try Link()
        defer { link.finish() }
        link.connectionWritable(false)
        link.circuit.writeAndFlush(ByteBuffer(string: "the last record"), promise: nil)
        link.circuit.close(promise: nil)
        try exchangeBytes(link.device, link.controller)
        #expect(link.seen.events.withLockedValue { $0 }.isEmpty, "the reset went out before the record")
        link.connectionWritable(true)
        try exchangeBytes(link.device, link.controller)
        #expect(link.seen.events.withLockedValue { $0 } == ["the last record", "RST_STREAM"])
    }

    @Test("a record that cannot leave does not pin the stream: the reset goes after the linger")
    func resetIsBounded() throws {
        let link = try Link()
        defer { link.finish() }
        link.connectionWritable(false)
        link.circuit.writeAndFlush(ByteBuffer(string: "stuck"), promise: nil)
        link.circuit.close(promise: nil)
        link.loop.advanceTime(by: CircuitChannel.lingerTimeout)
        link.connectionWritable(true)
        try exchangeBytes(link.device, link.controller)
        // The record was dropped with the stream's buffer when the reset went; the reset itself arrives.
        #expect(link.seen.events.withLockedValue { $0 } == ["RST_STREAM"])
    }

    /// The peer's end of the stream, its response head sent so that it may send DATA.
    static func answering(_ link: Link) throws -> any Channel {
        let peer = try #require(link.seen.stream)
        peer.writeAndFlush(HTTP2Frame.FramePayload.headers(.init(headers: [":status": "200"])), promise: nil)
        try exchangeBytes(link.device, link.controller)
        return peer
    }

    @Test(
        "a path ended cleanly lingers while the peer sends (its ACKs of the last records), and is reset after 10 s of silence"
    )
    func lingerFollowsThePeer() throws {
        let link = try IdentityRetentionTests.circuit(CircuitRetention(), peer: "device-1")
        defer { link.finish() }
        _ = try IdentityRetentionTests.fill(link, limit: 2)
        link.circuit.close(mode: .output, promise: nil)
        link.circuit.triggerUserOutboundEvent(CircuitRecordsEvent.peerFinished, promise: nil)
        // Both ends ended, ours not yet acknowledged: the close ends the path cleanly and lets it linger.
        link.circuit.close(promise: nil)
        try exchangeBytes(link.device, link.controller)
        let ended = link.seen.events.withLockedValue { $0 }.contains("END_STREAM")
        #expect(ended)
        let peer = try Self.answering(link)
        for _ in 0..<5 {
            link.loop.advanceTime(by: .seconds(9))
            peer.writeAndFlush(
                HTTP2Frame.FramePayload.data(.init(data: .byteBuffer(ByteBuffer(string: "an ACK")))),
                promise: nil
            )
            try exchangeBytes(link.device, link.controller)
        }
        let reset = link.seen.events.withLockedValue { $0 }.contains("RST_STREAM")
        #expect(!reset, "reset while the peer was sending")
        link.loop.advanceTime(by: CircuitChannel.lingerTimeout)
        try exchangeBytes(link.device, link.controller)
        #expect(link.seen.events.withLockedValue { $0.last } == "RST_STREAM")
    }

    @Test("a peer that keeps sending does not pin a lingering path: it is reset at the limit")
    func lingerIsBounded() throws {
        let link = try IdentityRetentionTests.circuit(CircuitRetention(), peer: "device-1")
        defer { link.finish() }
        link.circuit.close(mode: .output, promise: nil)
        link.circuit.triggerUserOutboundEvent(CircuitRecordsEvent.peerFinished, promise: nil)
        link.circuit.close(promise: nil)
        try exchangeBytes(link.device, link.controller)
        let peer = try Self.answering(link)
        var elapsed = TimeAmount.zero
        while elapsed < CircuitChannel.lingerLimit, !link.seen.events.withLockedValue({ $0 }).contains("RST_STREAM") {
            link.loop.advanceTime(by: .seconds(5))
            elapsed = elapsed + .seconds(5)
            peer.writeAndFlush(
                HTTP2Frame.FramePayload.data(.init(data: .byteBuffer(ByteBuffer(string: "x")))),
                promise: nil
            )
            try exchangeBytes(link.device, link.controller)
        }
        #expect(link.seen.events.withLockedValue { $0 }.contains("RST_STREAM"))
        #expect(elapsed == CircuitChannel.lingerLimit)
    }
}
