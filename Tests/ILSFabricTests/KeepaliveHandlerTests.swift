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

        let handler: KeepaliveHandler

        init(idle: FabricKeepalive.Idle? = nil) throws {
            let dead = self.dead
            handler = KeepaliveHandler(KeepaliveHandlerTests.keepalive, idle: idle) { dead.withLockedValue { $0 += 1 } }
            try channel.pipeline.syncOperations.addHandler(handler)
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

    // MARK: A device's connection while no circuit is open (issue 39: nothing spent while idle)

    @Test("an idle device connection sends no PING, and closes after the idle time")
    func idleConnectionIsSilentThenClosed() throws {
        let setup = try Setup(idle: FabricKeepalive.Idle(closeAfter: .seconds(15)))
        setup.handler.streamOpened()
        setup.handler.streamClosed()
        setup.advance(.seconds(14))
        #expect(setup.channel.isActive)
        setup.advance(.seconds(1))
        #expect(!setup.channel.isActive)
        #expect(try setup.pings() == 0)
        #expect(setup.dead.withLockedValue { $0 } == 0, "an idle close is no dead peer")
    }

    /// A short idle time must not cut a new connection whose TLS handshake and first circuit are slow to come.
    @Test("a new connection waits for its first circuit at least `Idle.unused` before the idle close applies")
    func newConnectionWaitsForItsFirstCircuit() throws {
        let setup = try Setup(idle: FabricKeepalive.Idle(closeAfter: .milliseconds(200)))
        setup.advance(FabricKeepalive.Idle.unused - .milliseconds(1))
        #expect(setup.channel.isActive)
        setup.advance(.milliseconds(1))
        #expect(!setup.channel.isActive, "a connection never used is closed all the same")
        #expect(try setup.pings() == 0)
    }

    @Test("with a circuit open the device pings as before; the idle time starts when the last one closes")
    func circuitsKeepTheKeepalive() throws {
        let setup = try Setup(idle: FabricKeepalive.Idle(closeAfter: .seconds(15)))
        setup.handler.streamOpened()
        setup.advance(.seconds(25))
        #expect(try setup.pings() == 1)
        try setup.receive()
        setup.advance(.seconds(25))
        #expect(try setup.pings() == 1)
        try setup.receive()
        setup.handler.streamClosed()
        setup.advance(.seconds(14))
        #expect(setup.channel.isActive)
        #expect(try setup.pings() == 0)
        setup.advance(.seconds(1))
        #expect(!setup.channel.isActive)
    }

    @Test("without an idle close, an idle device connection stays open and still sends nothing")
    func idleWithoutCloseStaysSilent() throws {
        let setup = try Setup(idle: FabricKeepalive.Idle(closeAfter: nil))
        setup.advance(.seconds(600))
        #expect(setup.channel.isActive)
        #expect(try setup.pings() == 0)
        // A circuit opening after the long silence probes the connection at once.
        setup.handler.streamOpened()
        setup.advance(.zero)
        #expect(try setup.pings() == 1)
    }

    @Test("a probe (a circuit about to be asked for) starts the idle time over")
    func probeRestartsTheIdleTime() throws {
        let setup = try Setup(idle: FabricKeepalive.Idle(closeAfter: .seconds(15)))
        setup.advance(.seconds(10))
        setup.channel.pipeline.triggerUserOutboundEvent(FabricKeepalive.Probe(), promise: nil)
        #expect(try setup.pings() == 1)
        try setup.receive()
        setup.advance(.seconds(14))
        #expect(setup.channel.isActive)
        setup.advance(.seconds(1))
        #expect(!setup.channel.isActive)
    }

    @Test(
        "StreamsEnded succeeds once the last open stream has closed, at once with none open, and fails when the connection closes first"
    )
    func streamsEnded() throws {
        let setup = try Setup(idle: FabricKeepalive.Idle(closeAfter: .seconds(15)))
        /// nil while pending, then whether it succeeded.
        func ask() -> NIOLockedValueBox<Bool?> {
            let done = NIOLockedValueBox<Bool?>(nil)
            let promise = setup.channel.eventLoop.makePromise(of: Void.self)
            promise.futureResult.whenComplete { result in done.withLockedValue { $0 = (try? result.get()) != nil } }
            setup.channel.pipeline.triggerUserOutboundEvent(FabricKeepalive.StreamsEnded(), promise: promise)
            return done
        }
        #expect(ask().withLockedValue { $0 } == true)

        setup.handler.streamOpened()
        setup.handler.streamOpened()
        let two = ask()
        setup.handler.streamClosed()
        #expect(two.withLockedValue { $0 } == nil)
        setup.handler.streamClosed()
        #expect(two.withLockedValue { $0 } == true)

        setup.handler.streamOpened()
        // Closed with a stream open: what it had not written never will be, so the answer is a failure.
        let closing = ask()
        #expect(closing.withLockedValue { $0 } == nil)
        _ = try? setup.channel.close().wait()
        #expect(closing.withLockedValue { $0 } == false)
        #expect(ask().withLockedValue { $0 } == false)
        // Run out the timers the handler scheduled (cancelled, they stay in the embedded loop's queue until their time,
        // holding the handler and through it the channel: LeakSanitizer reports the cycle).
        setup.advance(.hours(1))
    }
}
