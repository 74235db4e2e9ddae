import Foundation
import ILSCore
import NIOCore

/// Enforces `APIRequestDeadlines` on an API connection. Sits between TLS and the HTTP codec, where it sees the
/// plaintext bytes as they arrive (so a request's first byte starts its head's deadline, which no HTTP part could
/// tell), and learns where requests begin and end from `ControllerHTTPHandler`, which sends an
/// `APIRequestDeadlineHandler.Event` outbound as a request's head arrives and as its answer is written.
///
/// It writes its 408 itself, as bytes: below the codec a response needs no request head to answer (NIO's pipelining
/// handler refuses a response to a request whose head never arrived), and the connection closes right after. One
/// timer per connection, set for the current deadline; a phase that moved the deadline on is noticed when it
/// fires, so requests schedule nothing.
final class APIRequestDeadlineHandler: ChannelDuplexHandler, RemovableChannelHandler {
    typealias InboundIn = ByteBuffer
    typealias OutboundIn = IOData
    typealias OutboundOut = IOData

    /// Where a request is, as `ControllerHTTPHandler` sees it.
    enum Event {
        case headReceived
        case responseSent
    }

    /// After a 408 is written, how long a client that does not read it may keep the connection.
    static let answerGrace: TimeAmount = .seconds(2)

    private let timeouts: APIRequestDeadlines.Timeouts
    private let onTimeout: @Sendable () -> Void
    private var deadlines: APIRequestDeadlines?
    private var timer: Scheduled<Void>?

    /// `onTimeout` is called once for each connection answered 408 (for the metrics).
    init(timeouts: APIRequestDeadlines.Timeouts, onTimeout: @escaping @Sendable () -> Void = {}) {
        self.timeouts = timeouts
        self.onTimeout = onTimeout
    }

    func handlerAdded(context: ChannelHandlerContext) {
        if context.channel.isActive { start(context) }
    }

    func channelActive(context: ChannelHandlerContext) {
        start(context)
        context.fireChannelActive()
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        timer?.cancel()
        timer = nil
    }

    func channelInactive(context: ChannelHandlerContext) {
        timer?.cancel()
        timer = nil
        context.fireChannelInactive()
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        // Past a deadline the connection is closing: what still arrives must not complete a request that would be
        // answered after the 408.
        guard deadlines?.state != .expired else { return }
        deadlines?.bytesArrived(now: .now())
        context.fireChannelRead(data)
    }

    func triggerUserOutboundEvent(context: ChannelHandlerContext, event: Any, promise: EventLoopPromise<Void>?) {
        guard let event = event as? Event else {
            context.triggerUserOutboundEvent(event, promise: promise)
            return
        }
        switch event {
        case .headReceived: deadlines?.headReceived(now: .now())
        case .responseSent: deadlines?.responseSent(now: .now())
        }
        promise?.succeed()
    }

    private func start(_ context: ChannelHandlerContext) {
        guard deadlines == nil else { return }
        let deadlines = APIRequestDeadlines(timeouts: timeouts, startedAt: .now())
        self.deadlines = deadlines
        if let deadline = deadlines.deadline { schedule(at: deadline, context: context) }
    }

    private func schedule(at deadline: NIODeadline, context: ChannelHandlerContext) {
        let loopBound = NIOLoopBound((self, context), eventLoop: context.eventLoop)
        timer = context.eventLoop.scheduleTask(deadline: deadline) {
            let (handler, context) = loopBound.value
            handler.timerFired(context: context)
        }
    }

    private func timerFired(context: ChannelHandlerContext) {
        timer = nil
        guard var deadlines else { return }
        let action = deadlines.timerFired(now: .now())
        self.deadlines = deadlines
        switch action {
        case .wait(let deadline):
            schedule(at: deadline, context: context)
        case .close:
            context.close(promise: nil)
        case .answerTimeoutAndClose:
            onTimeout()
            let channel = context.channel
            context.writeAndFlush(wrapOutboundOut(.byteBuffer(Self.timeoutAnswer))).whenComplete { _ in
                channel.close(promise: nil)
            }
            // A client that reads nothing would leave the write pending for as long as it likes.
            context.eventLoop.scheduleTask(in: Self.answerGrace) { channel.close(promise: nil) }
        }
    }

    /// `408 Request Timeout` with the controller's JSON error body, `Connection: close`.
    static let timeoutAnswer: ByteBuffer = {
        let body =
            (try? JSONEncoder().encode(
                ControllerAPI.ErrorBody(error: "the request did not arrive in time", code: "request_timeout")
            )) ?? Data()
        let head =
            "HTTP/1.1 408 Request Timeout\r\nContent-Type: application/json\r\nContent-Length: \(body.count)\r\n"
            + "Cache-Control: no-store\r\nConnection: close\r\n\r\n"
        return ByteBuffer(bytes: Array(head.utf8) + Array(body))
    }()
}
