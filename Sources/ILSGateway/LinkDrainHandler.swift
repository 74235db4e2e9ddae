import NIOCore
import NIOHTTP2

/// Lets a gateway link that should go away (its certificate was just renewed) finish the circuits it carries, then
/// closes it. The relay sends no new circuit to a link whose certificate is no longer current, so once the gateway has
/// re-linked with its new certificate the old link only drains; a renewal cuts no stream.
///
/// Counts the link's open streams from swift-nio-http2's stream events, leaving out the first stream the controller
/// opened (the control stream, which lives as long as the link).
final class LinkDrainHandler: ChannelDuplexHandler {
    typealias InboundIn = Any
    typealias OutboundIn = Any

    /// Sent as an outbound user event on the link's channel: close once no circuit is open.
    struct Drain: Sendable {}

    private var controlStream: HTTP2StreamID?
    private var circuits = 0
    private var draining = false

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        switch event {
        case let created as NIOHTTP2StreamCreatedEvent:
            if controlStream == nil {
                controlStream = created.streamID
            } else {
                circuits += 1
            }
        case let closed as StreamClosedEvent where closed.streamID != controlStream:
            circuits -= 1
            closeIfDrained(context: context)
        default:
            break
        }
        context.fireUserInboundEventTriggered(event)
    }

    func triggerUserOutboundEvent(context: ChannelHandlerContext, event: Any, promise: EventLoopPromise<Void>?) {
        guard event is Drain else {
            context.triggerUserOutboundEvent(event, promise: promise)
            return
        }
        draining = true
        promise?.succeed()
        closeIfDrained(context: context)
    }

    private func closeIfDrained(context: ChannelHandlerContext) {
        guard draining, circuits <= 0 else { return }
        context.close(promise: nil)
    }
}
