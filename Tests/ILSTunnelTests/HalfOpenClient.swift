import NIOConcurrencyHelpers
import NIOCore
import NIOPosix

/// A client that keeps its side of the connection open after the server ends its output (remote half-closure
/// allowed), as a client that never hangs up would: what the server sent is collected, and `answered` completes when
/// the server's output ends.
final class HalfOpenClient: Sendable {
    let channel: any Channel
    let received: NIOLockedValueBox<ByteBuffer>
    let answered: EventLoopPromise<Void>

    private init(channel: any Channel, received: NIOLockedValueBox<ByteBuffer>, answered: EventLoopPromise<Void>) {
        self.channel = channel
        self.received = received
        self.answered = answered
    }

    static func connect(port: Int) async throws -> HalfOpenClient {
        let received = NIOLockedValueBox(ByteBuffer())
        let group = MultiThreadedEventLoopGroup.singleton
        let answered = group.any().makePromise(of: Void.self)
        let channel = try await ClientBootstrap(group: group)
            .channelOption(.allowRemoteHalfClosure, value: true)
            .channelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    try channel.pipeline.syncOperations.addHandler(Collector(received: received, answered: answered))
                }
            }
            .connect(host: "127.0.0.1", port: port).get()
        return HalfOpenClient(channel: channel, received: received, answered: answered)
    }

    /// Confined to the channel's event loop.
    private final class Collector: ChannelInboundHandler {
        typealias InboundIn = ByteBuffer
        let received: NIOLockedValueBox<ByteBuffer>
        let answered: EventLoopPromise<Void>
        private var done = false

        init(received: NIOLockedValueBox<ByteBuffer>, answered: EventLoopPromise<Void>) {
            self.received = received
            self.answered = answered
        }

        func channelRead(context: ChannelHandlerContext, data: NIOAny) {
            var bytes = unwrapInboundIn(data)
            received.withLockedValue { $0.writeBuffer(&bytes) }
        }

        func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
            if case ChannelEvent.inputClosed = event { finish(nil) }
            context.fireUserInboundEventTriggered(event)
        }

        func channelInactive(context: ChannelHandlerContext) {
            finish(ChannelError.eof)
            context.fireChannelInactive()
        }

        private func finish(_ error: (any Error)?) {
            guard !done else { return }
            done = true
            if let error { answered.fail(error) } else { answered.succeed() }
        }
    }
}
