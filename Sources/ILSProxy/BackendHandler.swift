import NIOConcurrencyHelpers
import NIOCore
import NIOHTTP1

/// The exchange currently using a backend connection. Called on the connection's event loop only.
protocol BackendConnectionDelegate: AnyObject {
    func backendReceived(_ part: HTTPClientResponsePart)
    func backendReadComplete()
    func backendWritabilityChanged(isWritable: Bool)
    func backendClosed(error: (any Error)?)
}

/// The last handler of a pooled backend connection: it hands response parts to whichever exchange leased the
/// connection, and holds the connection's reads while that exchange's client cannot take more data.
///
/// Holding reads is the backpressure: a client that reads slowly stops the gateway reading from the backend, so the
/// kernel's socket buffers fill and the backend itself is slowed. Gateway memory stays bounded by a few buffers
/// per connection whatever the response size.
final class BackendHandler: ChannelDuplexHandler, RemovableChannelHandler {
    typealias InboundIn = HTTPClientResponsePart
    typealias OutboundIn = HTTPClientRequestPart
    typealias OutboundOut = HTTPClientRequestPart

    /// Set while the connection is leased; `nil` while it idles in the pool.
    weak var delegate: (any BackendConnectionDelegate)?
    /// How many requests this connection has carried, counting the current one.
    var requestCount = 0
    /// Counts this connection in while it holds a read (`BackendPool.heldReads`); set by the pool.
    var heldReads: NIOLockedValueBox<Int>?
    private var context: ChannelHandlerContext?
    private var readsAllowed = true
    private var pendingRead = false
    private var closeError: (any Error)?

    var channel: (any Channel)? { context?.channel }
    var isActive: Bool { context?.channel.isActive ?? false }
    var isWritable: Bool { context?.channel.isWritable ?? false }

    func handlerAdded(context: ChannelHandlerContext) {
        self.context = context
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        self.context = nil
        if pendingRead {
            pendingRead = false
            heldReads?.withLockedValue { $0 -= 1 }
        }
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        let part = unwrapInboundIn(data)
        guard let delegate else {
            // An idle connection must be silent; bytes now mean the backend is confused about framing.
            context.close(promise: nil)
            return
        }
        delegate.backendReceived(part)
    }

    func channelReadComplete(context: ChannelHandlerContext) {
        delegate?.backendReadComplete()
    }

    func channelWritabilityChanged(context: ChannelHandlerContext) {
        delegate?.backendWritabilityChanged(isWritable: context.channel.isWritable)
        context.fireChannelWritabilityChanged()
    }

    func channelInactive(context: ChannelHandlerContext) {
        let delegate = self.delegate
        self.delegate = nil
        delegate?.backendClosed(error: closeError)
        context.fireChannelInactive()
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        if closeError == nil { closeError = error }
        context.close(promise: nil)
    }

    func read(context: ChannelHandlerContext) {
        if readsAllowed {
            context.read()
        } else if !pendingRead {
            pendingRead = true
            heldReads?.withLockedValue { $0 += 1 }
        }
    }

    /// Lets reads through only while the partner (the client) can take what they bring.
    func setReadsAllowed(_ allowed: Bool) {
        readsAllowed = allowed
        if allowed, pendingRead, let context {
            pendingRead = false
            heldReads?.withLockedValue { $0 -= 1 }
            context.read()
        }
    }

    func write(_ part: HTTPClientRequestPart) {
        context?.write(wrapOutboundOut(part), promise: nil)
    }

    func flush() {
        context?.flush()
    }

    func close() {
        context?.close(promise: nil)
    }
}
