import NIOConcurrencyHelpers
import NIOCore
import NIOEmbedded
import NIOHTTP2
import Testing

@testable import ILSFabric

/// `KeepaliveHandler` on an embedded channel, where the loop's clock only moves when the test moves it: a connection
/// that receives nothing sends a PING after the interval and is closed when nothing answers within the timeout; any
/// frame that arrives keeps it open.
@Suite("Keepalive: a silent overlay connection is pinged, and closed when nothing answers")
struct KeepaliveHandlerTests {
    static let keepalive = FabricKeepalive(interval: .seconds(25), timeout: .seconds(10))

    final class Setup {
        let channel = EmbeddedChannel()
        let dead = NIOLockedValueBox(0)

        init() throws {
            let dead = self.dead
            try channel.pipeline.syncOperations.addHandler(
                KeepaliveHandler(KeepaliveHandlerTests.keepalive) { dead.withLockedValue { $0 += 1 } }
            )
            try channel.connect(to: SocketAddress(ipAddress: "127.0.0.1", port: 1)).wait()
        }

        func advance(_ amount: TimeAmount) { channel.embeddedEventLoop.advanceTime(by: amount) }

        /// The PINGs written since the last call.
        func pings() throws -> Int {
            var count = 0
            while let frame = try channel.readOutbound(as: HTTP2Frame.self) {
                guard case .ping(_, ack: false) = frame.payload, frame.streamID == .rootStream else {
                    Issue.record("unexpected frame \(frame)")
                    continue
                }
                count += 1
            }
            return count
        }

        /// A frame from the peer (a PING's ACK, or anything else: all of it shows the peer is there).
        func receive(_ payload: HTTP2Frame.FramePayload = .ping(HTTP2PingData(withInteger: 1), ack: true)) throws {
            try channel.writeInbound(HTTP2Frame(streamID: .rootStream, payload: payload))
            while try channel.readInbound(as: HTTP2Frame.self) != nil {}
        }
    }

    @Test("a link that goes silent is pinged after the interval and closed after the timeout")
    func silentLinkIsClosed() throws {
        let setup = try Setup()
        setup.advance(.seconds(24))
        #expect(try setup.pings() == 0)
        setup.advance(.seconds(1))
        #expect(try setup.pings() == 1)
        setup.advance(.seconds(9))
        #expect(setup.channel.isActive)
        setup.advance(.seconds(1))
        #expect(!setup.channel.isActive)
        #expect(setup.dead.withLockedValue { $0 } == 1)
    }

    @Test("an answered PING keeps the link, and the next PING comes one interval after the last frame")
    func answeredPingKeepsTheLink() throws {
        let setup = try Setup()
        setup.advance(.seconds(25))
        #expect(try setup.pings() == 1)
        setup.advance(.seconds(2))
        try setup.receive()
        setup.advance(.seconds(8))  // the timeout passes: answered, so nothing happens
        #expect(setup.channel.isActive)
        #expect(try setup.pings() == 0)
        setup.advance(.seconds(17))  // 27 + 25 = 52 s: the next PING
        #expect(try setup.pings() == 1)
        setup.advance(.seconds(10))
        #expect(!setup.channel.isActive)
        try? setup.channel.close().wait()
    }

    @Test("a link that receives frames never pings")
    func busyLinkNeverPings() throws {
        let setup = try Setup()
        for _ in 0..<30 {
            setup.advance(.seconds(20))
            try setup.receive(.windowUpdate(windowSizeIncrement: 1))
        }
        #expect(try setup.pings() == 0)
        #expect(setup.channel.isActive)
        _ = try setup.channel.finish()
    }

    @Test("a read-complete alone (frames for circuits go to the stream channels) counts as a sign of life")
    func readCompleteCounts() throws {
        let setup = try Setup()
        for _ in 0..<5 {
            setup.advance(.seconds(20))
            setup.channel.pipeline.fireChannelReadComplete()
        }
        #expect(try setup.pings() == 0)
        _ = try setup.channel.finish()
    }

    @Test("a probe pings a quiet link at once and closes it when nothing answers; a fresh link is not probed")
    func probe() throws {
        let setup = try Setup()
        setup.advance(.seconds(5))
        try setup.receive()
        setup.channel.pipeline.triggerUserOutboundEvent(FabricKeepalive.Probe(fresh: .seconds(1)), promise: nil)
        #expect(try setup.pings() == 0)  // a frame came 0 s ago
        setup.advance(.seconds(3))
        setup.channel.pipeline.triggerUserOutboundEvent(FabricKeepalive.Probe(fresh: .seconds(1)), promise: nil)
        #expect(try setup.pings() == 1)
        setup.advance(.seconds(10))
        #expect(!setup.channel.isActive)  // 18 s after the last frame, well before the 35 s of interval + timeout
    }
}
