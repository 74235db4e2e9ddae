import ILSCore
import NIOCore
import NIOPosix
import Testing

@testable import ILSProxy

/// What a real backend connection is opened with; the memory it keeps follows from these options (docs/soak.md).
@Suite("Backend connections")
struct BackendConnectionTests {
    @Test("a backend connection reads once per event-loop turn, so it keeps one receive buffer, not four")
    func oneReadPerTurn() async throws {
        let group = MultiThreadedEventLoopGroup(numberOfThreads: 1)
        let listener = try await ServerBootstrap(group: group)
            .childChannelInitializer { _ in group.any().makeSucceededVoidFuture() }
            .bind(host: "127.0.0.1", port: 0).get()
        let port = try #require(listener.localAddress?.port)
        let configuration = ProxyConfiguration(backend: BackendURL(host: "127.0.0.1", port: port))
        let channel = try await LoopBackendPool.connectTCP(on: group.any(), configuration: configuration) {
            $0.eventLoop.makeSucceededVoidFuture()
        }.get()
        #expect(try await channel.getOption(.maxMessagesPerRead).get() == 1)
        #expect(try await channel.getOption(.tcpOption(.tcp_nodelay)).get() != 0)
        try await channel.close()
        try await listener.close()
        try await group.shutdownGracefully()
    }
}
