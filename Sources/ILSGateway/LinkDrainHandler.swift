import NIOCore
import NIOHTTP2

/// Lets a gateway link that should go away (its certificate was just renewed) finish the circuits it carries, then
/// closes it. The relay sends no new circuit to a link whose certificate is no longer current, so once the gateway has
/// re-linked with its new certificate the old link only drains; a renewal cuts no stream.
///
/// Learns of the link's streams as the HTTP/2 handler's stream delegate: swift-nio-http2's inline multiplexer tells
/// its delegate of each stream created and closed, and does not pass those events down the pipeline (this handler
/// first counted them there, saw none, and closed a draining link with a live stream on it). Leaves out the first
/// stream the controller opened (the control stream, which lives as long as the link), and keeps a set of stream ids,
/// so a stream reported closed twice cannot count for another.
final class LinkDrainHandler: ChannelOutboundHandler, NIOHTTP2StreamDelegate, @unchecked Sendable {
    // @unchecked Sendable: every method runs on the link's event loop (the HTTP/2 handler calls its delegate there),
    // which is the only place the state below is touched.
    typealias OutboundIn = Any

    /// Sent as an outbound user event on the link's channel: close once no circuit is open.
    struct Drain: Sendable {}

    private var context: ChannelHandlerContext?
    private var controlStream: HTTP2StreamID?
    private var circuits: Set<HTTP2StreamID> = []
    private var draining = false

    func handlerAdded(context: ChannelHandlerContext) { self.context = context }

    func handlerRemoved(context: ChannelHandlerContext) { self.context = nil }

    func streamCreated(_ id: HTTP2StreamID, channel: any Channel) {
        if controlStream == nil {
            controlStream = id
        } else {
            circuits.insert(id)
        }
    }

    func streamClosed(_ id: HTTP2StreamID, channel: any Channel) {
        circuits.remove(id)
        closeIfDrained()
    }

    func triggerUserOutboundEvent(context: ChannelHandlerContext, event: Any, promise: EventLoopPromise<Void>?) {
        guard event is Drain else {
            context.triggerUserOutboundEvent(event, promise: promise)
            return
        }
        draining = true
        promise?.succeed()
        closeIfDrained()
    }

    private func closeIfDrained() {
        guard draining, circuits.isEmpty else { return }
        context?.close(promise: nil)
    }
}
