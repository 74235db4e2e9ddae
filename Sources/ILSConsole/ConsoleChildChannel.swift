import HummingbirdCore
import ILSFabric
import Logging
import NIOCore

/// Hummingbird's child channel (HTTP/1, or TLS around it) behind the console's connection caps: each accepted
/// connection is counted in by `ConnectionLimiter` (the controller's and HTTP mode's) before anything of it is set
/// up, a refused one is closed at once, before TLS, and an admitted one is released when it closes.
///
/// Here and not on the listener, as the controller does: Hummingbird offers no hook on its listening channel, only
/// `availableConnectionsDelegate`, which stops accepting when full (a client with many connections would then keep
/// every other one waiting in the kernel's queue) and knows no per-source cap. The setup runs on each connection's
/// own event loop, so of connections that arrive together beyond a cap, which one is refused is not defined (the
/// count is exact all the same).
struct ConsoleChildChannel<Base: ServerChildChannel>: ServerChildChannel {
    typealias Value = Base.Value

    let base: Base
    let limiter: ConnectionLimiter
    let logger: Logger

    func setup(channel: any Channel, logger: Logger) -> EventLoopFuture<Value> {
        let source = channel.remoteAddress?.ipAddress ?? "unknown"
        switch limiter.admit(source: source) {
        case .admitted:
            let limiter = self.limiter
            channel.closeFuture.whenComplete { _ in limiter.release(source: source) }
            // A failed setup is dropped by NIO's async accept without a close: closed here, or its descriptor and its
            // slot in the caps would be held for good.
            return base.setup(channel: channel, logger: logger).flatMapErrorThrowing { error in
                channel.close(promise: nil)
                throw error
            }
        case .refused(let refusal):
            if refusal.logged {
                self.logger.warning(
                    "console connection refused: too many open connections",
                    metadata: [
                        "source": "\(refusal.source)", "cap": "\(refusal.cap.rawValue)",
                        "unlogged_refusals": "\(refusal.unlogged)",
                    ]
                )
            }
            channel.close(promise: nil)
            return channel.eventLoop.makeFailedFuture(ChannelError.inputClosed)
        }
    }

    func handle(value: Value, logger: Logger) async {
        await base.handle(value: value, logger: logger)
    }
}
