import NIOConcurrencyHelpers
import NIOCore
import NIOPosix

/// A TCP listener on 127.0.0.1 that accepts every connection and closes it at once, counting them: a controller
/// that is there but fails every request after the connection was made (a crash mid-request, a middlebox).
public final class TestHangUpServer: Sendable {
    public let port: Int
    private let channel: any Channel
    private let accepted: NIOLockedValueBox<Int>

    public var connectionsAccepted: Int { accepted.withLockedValue { $0 } }

    public init() async throws {
        let accepted = NIOLockedValueBox(0)
        channel = try await ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .childChannelInitializer { channel in
                accepted.withLockedValue { $0 += 1 }
                return channel.close()
            }
            .bind(host: "127.0.0.1", port: 0).get()
        self.accepted = accepted
        port = channel.localAddress?.port ?? 0
    }

    public func stop() async {
        try? await channel.close()
    }
}
