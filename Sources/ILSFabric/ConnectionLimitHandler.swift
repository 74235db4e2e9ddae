public import NIOCore

/// On a listening channel, ahead of the bootstrap's accept handler: asks a `ConnectionLimiter` about each accepted
/// socket and closes a refused one at once, before it is registered with an event loop, before TLS, before any
/// handler of the child pipeline exists. An admitted socket is counted until its channel closes.
///
/// Add it in `serverChannelInitializer`, which runs before `ServerBootstrap` appends its own accept handler, so this
/// handler sees every accepted channel first.
public final class ConnectionLimitHandler: ChannelInboundHandler, Sendable {
    public typealias InboundIn = any Channel
    public typealias InboundOut = any Channel

    /// What the server counts and logs; called on the listener's event loop (`refused`) or a connection's
    /// (`openChanged`, after a close).
    public struct Observer: Sendable {
        public var openChanged: @Sendable (Int) -> Void
        public var refused: @Sendable (ConnectionLimiter.Refusal) -> Void

        public init(
            openChanged: @escaping @Sendable (Int) -> Void,
            refused: @escaping @Sendable (ConnectionLimiter.Refusal) -> Void
        ) {
            self.openChanged = openChanged
            self.refused = refused
        }
    }

    private let limiter: ConnectionLimiter
    private let observer: Observer

    public init(limiter: ConnectionLimiter, observer: Observer) {
        self.limiter = limiter
        self.observer = observer
    }

    public func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        let child = unwrapInboundIn(data)
        let source = child.remoteAddress?.ipAddress ?? "unknown"
        switch limiter.admit(source: source) {
        case .admitted:
            let limiter = self.limiter
            let observer = self.observer
            child.closeFuture.whenComplete { _ in
                limiter.release(source: source)
                observer.openChanged(limiter.openConnections)
            }
            observer.openChanged(limiter.openConnections)
            context.fireChannelRead(data)
        case .refused(let refusal):
            child.close(promise: nil)
            observer.refused(refusal)
        }
    }
}
