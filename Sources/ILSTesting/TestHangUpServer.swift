import NIOConcurrencyHelpers
import NIOCore
import NIOPosix

/// A TCP listener on 127.0.0.1 that accepts every connection and then either closes it at once (a controller that is
/// there but fails every request after the connection was made: a crash mid-request, a middlebox) or, `silent`,
/// holds it open and never sends a byte (a controller that hangs), counting them.
public final class TestHangUpServer: Sendable {
    public let port: Int
    private let channel: any Channel
    private let accepted: NIOLockedValueBox<Int>
    private let held: NIOLockedValueBox<[any Channel]>

    public var connectionsAccepted: Int { accepted.withLockedValue { $0 } }

    public init(silent: Bool = false) async throws {
        let accepted = NIOLockedValueBox(0)
        let held = NIOLockedValueBox<[any Channel]>([])
        channel = try await ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .childChannelInitializer { channel in
                accepted.withLockedValue { $0 += 1 }
                guard silent else { return channel.close() }
                held.withLockedValue { $0.append(channel) }
                return channel.eventLoop.makeSucceededVoidFuture()
            }
            .bind(host: "127.0.0.1", port: 0).get()
        self.accepted = accepted
        self.held = held
        port = channel.localAddress?.port ?? 0
    }

    public func stop() async {
        try? await channel.close()
        for connection in held.withLockedValue({ $0 }) { try? await connection.close() }
    }
}
