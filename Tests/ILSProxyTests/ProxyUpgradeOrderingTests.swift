import ILSCore
import ILSProxy
import Logging
import NIOConcurrencyHelpers
import NIOCore
import NIOEmbedded
import Testing

/// The protocol switch against the event loop's order of work, on embedded channels so the order is exact: the
/// client's first bytes of the new protocol may arrive before the loop has run anything queued while the 101 went
/// out, and bytes the backend sent with its 101 must be flushed without waiting for another read.
@Suite("A WebSocket switch loses no byte, whatever the loop runs first")
struct ProxyUpgradeOrderingTests {
    static let upgradeRequest = ByteBuffer(
        string: "GET /ws HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
            + "Sec-WebSocket-Version: 13\r\n\r\n"
    )
    static let switching = "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n"

    /// Sits at the client connection's socket end: when the 101 is written, the client "answers" at once, as a read
    /// the loop runs before whatever else was queued in the same tick.
    final class InstantAnswer: ChannelOutboundHandler {
        typealias OutboundIn = IOData
        private let answer: ByteBuffer
        private var answered = false

        init(_ answer: ByteBuffer) { self.answer = answer }

        func write(context: ChannelHandlerContext, data: NIOAny, promise: EventLoopPromise<Void>?) {
            if !answered, case .byteBuffer(let bytes) = unwrapOutboundIn(data),
                String(buffer: bytes).hasPrefix("HTTP/1.1 101")
            {
                answered = true
                let answer = self.answer
                context.eventLoop.assumeIsolated().execute {
                    context.fireChannelRead(NIOAny(answer))
                    context.fireChannelReadComplete()
                }
            }
            context.write(data, promise: promise)
        }
    }

    /// Sends the upgrade request and lets the backend answer it with `answer`, in one read.
    static func upgrade(_ setup: EmbeddedProxy, answer: String) throws {
        let sent = try setup.exchange(upgradeRequest, answer: answer)
        #expect(setup.backends.withLockedValue { $0.count } == 1)
        #expect(sent.hasPrefix("GET /ws HTTP/1.1\r\n"))
    }

    @Test("the client's first frame, arriving before the loop runs what the 101 queued, reaches the backend")
    func clientFrameRightAfterTheSwitch() throws {
        let frame = ByteBuffer(bytes: [0x82, 0x84, 1, 2, 3, 4, 0x70, 0x6B, 0x6D, 0x63])
        let setup = try EmbeddedProxy.make(clientHandler: InstantAnswer(frame))
        try Self.upgrade(setup, answer: Self.switching)
        let toClient = String(decoding: try EmbeddedProxy.drain(setup.client), as: UTF8.self)
        #expect(toClient.hasPrefix("HTTP/1.1 101"))
        #expect(try EmbeddedProxy.drain(setup.backend) == Array(frame.readableBytesView))
        #expect(setup.client.isActive && setup.backend.isActive)
        try setup.finish()
    }

    @Test("bytes the backend sends in the same read as its 101 are flushed to the client at once")
    func backendBytesWithThe101AreFlushed() throws {
        let setup = try EmbeddedProxy.make()
        try Self.upgrade(setup, answer: Self.switching + "hello\n")
        let toClient = String(decoding: try EmbeddedProxy.drain(setup.client), as: UTF8.self)
        #expect(toClient.hasPrefix("HTTP/1.1 101"))
        #expect(toClient.hasSuffix("\r\n\r\nhello\n"))
        // And the switched connection carries bytes both ways.
        try setup.client.writeInbound(ByteBuffer(string: "ping"))
        #expect(String(decoding: try EmbeddedProxy.drain(setup.backend), as: UTF8.self) == "ping")
        try setup.backend.writeInbound(ByteBuffer(string: "pong"))
        #expect(String(decoding: try EmbeddedProxy.drain(setup.client), as: UTF8.self) == "pong")
        try setup.finish()
    }

    /// What the backend sent in that same instant is lost: NIO's response decoder drops its leftovers when it sees
    /// end of stream. The client still gets the 101 and the close, never a hang.
    @Test("a backend that sends its 101 and closes at once: the client gets the 101, then the close")
    func backendClosingRightAfterThe101() throws {
        let setup = try EmbeddedProxy.make()
        try setup.client.writeInbound(Self.upgradeRequest)
        setup.loop.run()
        _ = try EmbeddedProxy.drain(setup.backend)
        try setup.backend.writeInbound(ByteBuffer(string: Self.switching + "bye\n"))
        _ = setup.backend.close(mode: .all)
        setup.loop.run()
        let toClient = String(decoding: try EmbeddedProxy.drain(setup.client), as: UTF8.self)
        #expect(toClient.hasPrefix("HTTP/1.1 101"))
        #expect(!setup.client.isActive)
        try setup.finish()
    }
}
