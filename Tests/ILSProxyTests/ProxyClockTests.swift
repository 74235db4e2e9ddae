import ILSCore
import ILSProxy
import Logging
import NIOCore
import NIOEmbedded
import Testing

/// The proxy's timers measure time on their event loop's clock, so an embedded loop (tests, the fuzz targets) drives
/// them deterministically. Read from the wall clock instead, a timer due by the loop's clock found itself not yet due,
/// rescheduled itself at once and spun until real time caught up (minutes of busy loop in the fuzz corpus replay).
@Suite("Proxy timers and the event loop's clock")
struct ProxyClockTests {
    struct NoBackend: Error {}

    @Test("an idle client connection closes when the loop's clock passes the idle timeout")
    func idleTimerFollowsTheLoopClock() throws {
        let loop = EmbeddedEventLoop()
        defer { try? loop.syncShutdownGracefully() }
        var configuration = ProxyConfiguration(backend: BackendURL(host: "127.0.0.1", port: 8000))
        configuration.clientIdleTimeout = .seconds(30)
        let pools = BackendPool(configuration: configuration, loopCount: 1) { eventLoop, _, _ in
            eventLoop.makeFailedFuture(NoBackend())
        }
        let core = ProxyCore(configuration: configuration, logger: Logger(label: "test"), pools: pools)
        let client = EmbeddedChannel(loop: loop)
        defer { _ = try? client.finish(acceptAlreadyClosed: true) }
        try core.configureClientPipeline(
            client.pipeline.syncOperations,
            client: ClientContext(
                remoteAddress: try SocketAddress(ipAddress: "192.0.2.1", port: 40000),
                scheme: .http,
                identity: nil
            )
        )
        _ = client.connect(to: try SocketAddress(ipAddress: "127.0.0.1", port: 80))
        loop.run()
        loop.advanceTime(by: .seconds(29))
        #expect(client.isActive, "closed before the idle timeout")
        loop.advanceTime(by: .seconds(2))
        #expect(!client.isActive, "still open after the idle timeout on the loop's clock")
    }
}
