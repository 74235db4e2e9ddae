public import NIOCore
import NIOHTTPTypes

/// How long a console client may take to send what it owes, counted from a fixed point and never reset by a byte:
/// Hummingbird's own idle timeout restarts with every read, so a client trickling a byte every few seconds could
/// otherwise hold a connection (and, with the connection cap, the console) for as long as it likes.
public struct ConsoleDeadlines: Sendable, Hashable {
    /// From accept to the first request's complete head: the TLS handshake and the head together.
    public var firstHead: TimeAmount
    /// From a request's head to the end of its body (a form, or one the console refuses and drains unread).
    public var body: TimeAmount
    /// From the end of the last response to the next request's complete head (a keep-alive connection at rest).
    public var idle: TimeAmount
    /// How long an answer may wait on a client that does not read it (the connection stays unwritable).
    public var unread: TimeAmount

    public init(
        firstHead: TimeAmount = .seconds(10),
        body: TimeAmount = .seconds(10),
        idle: TimeAmount = .seconds(30),
        unread: TimeAmount = .seconds(30)
    ) {
        self.firstHead = firstHead
        self.body = body
        self.idle = idle
        self.unread = unread
    }
}

/// Which deadline a console connection is under, as a value that takes an event and returns what to do with the
/// timer (the way swift-nio-http2's and Hummingbird's state machines are written), so it is tested without a socket.
///
/// The client owes bytes in two states only: before a request's head is complete (the first head, or the next one
/// after the last response) and between a head and the end of its body. While the console works on a complete
/// request there is no deadline: that pace is the console's own (its admin API calls have deadlines of their own).
/// A client that stops reading the answer is a separate bound (`ConsoleDeadlines.unread`, kept by the handler).
///
/// Pipelined requests are read as they come (Hummingbird's pipelining assistance is off), so a pipelining client's
/// later body can be held back by the server's own backpressure and meet its deadline; browsers do not pipeline.
struct ConsoleDeadlineMachine: Sendable {
    enum Action: Equatable, Sendable {
        /// (Re)arm the timer for this long from now.
        case arm(TimeAmount)
        /// No deadline until the next event.
        case disarm
        /// Leave the timer as it is.
        case keep
    }

    private enum State: Equatable {
        /// Waiting for a head, with `pending` answers still to write for requests already read (pipelining).
        case awaitingHead(pending: Int)
        /// A head was read; its body has not ended. `answered` once the console responded before the body ended (it
        /// refused the request); the body is then drained, under the same deadline.
        case readingBody(pending: Int, answered: Bool)
    }

    private let deadlines: ConsoleDeadlines
    private var state = State.awaitingHead(pending: 0)

    init(deadlines: ConsoleDeadlines) {
        self.deadlines = deadlines
    }

    /// The connection was accepted.
    func started() -> Action { .arm(deadlines.firstHead) }

    /// A request's head was read.
    mutating func head() -> Action {
        guard case .awaitingHead(let pending) = state else { return .keep }
        state = .readingBody(pending: pending, answered: false)
        return .arm(deadlines.body)
    }

    /// A request's end was read: the whole request is in.
    mutating func requestEnded() -> Action {
        guard case .readingBody(let pending, let answered) = state else { return .keep }
        let stillToAnswer = answered ? pending : pending + 1
        state = .awaitingHead(pending: stillToAnswer)
        // Nothing to write: at rest, under the idle deadline. Else the console works, and nothing is owed.
        return stillToAnswer == 0 ? .arm(deadlines.idle) : .disarm
    }

    /// A response's end was written.
    mutating func responseEnded() -> Action {
        switch state {
        case .awaitingHead(let pending):
            let left = max(pending - 1, 0)
            state = .awaitingHead(pending: left)
            return left == 0 ? .arm(deadlines.idle) : .keep
        case .readingBody(let pending, let answered):
            if pending > 0 {
                // The answer to an earlier, complete request; the body being read is still owed.
                state = .readingBody(pending: pending - 1, answered: answered)
            } else {
                state = .readingBody(pending: 0, answered: true)
            }
            return .keep
        }
    }
}

/// Applies `ConsoleDeadlineMachine` to a connection: it sits behind Hummingbird's HTTP/1 codec (request and response
/// parts), is added when the connection is set up (before a TLS handshake, which the first deadline covers), and
/// closes the connection when a deadline passes.
final class ConsoleDeadlineHandler: ChannelDuplexHandler, RemovableChannelHandler {
    typealias InboundIn = HTTPRequestPart
    typealias InboundOut = HTTPRequestPart
    typealias OutboundIn = HTTPResponsePart
    typealias OutboundOut = HTTPResponsePart

    private var machine: ConsoleDeadlineMachine
    private let unread: TimeAmount
    private var timer: Scheduled<Void>?
    private var generation = 0
    /// Set while the connection is unwritable: the client is not reading what the console writes.
    private var unreadTimer: Scheduled<Void>?

    init(deadlines: ConsoleDeadlines) {
        machine = ConsoleDeadlineMachine(deadlines: deadlines)
        unread = deadlines.unread
    }

    func handlerAdded(context: ChannelHandlerContext) {
        apply(machine.started(), context: context)
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        cancelTimers()
    }

    func channelInactive(context: ChannelHandlerContext) {
        cancelTimers()
        context.fireChannelInactive()
    }

    func channelWritabilityChanged(context: ChannelHandlerContext) {
        if context.channel.isWritable {
            unreadTimer?.cancel()
            unreadTimer = nil
        } else if unreadTimer == nil {
            let channel = context.channel
            unreadTimer = context.eventLoop.scheduleTask(in: unread) {
                // Still unwritable, or it would have been cancelled: the answer is not being read.
                channel.close(promise: nil)
            }
        }
        context.fireChannelWritabilityChanged()
    }

    private func cancelTimers() {
        timer?.cancel()
        timer = nil
        unreadTimer?.cancel()
        unreadTimer = nil
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        switch unwrapInboundIn(data) {
        case .head: apply(machine.head(), context: context)
        case .body: break
        case .end: apply(machine.requestEnded(), context: context)
        }
        context.fireChannelRead(data)
    }

    func write(context: ChannelHandlerContext, data: NIOAny, promise: EventLoopPromise<Void>?) {
        if case .end = unwrapOutboundIn(data) { apply(machine.responseEnded(), context: context) }
        context.write(data, promise: promise)
    }

    private func apply(_ action: ConsoleDeadlineMachine.Action, context: ChannelHandlerContext) {
        switch action {
        case .keep:
            return
        case .disarm:
            timer?.cancel()
            timer = nil
        case .arm(let amount):
            timer?.cancel()
            // A timer cancelled too late to stop its task (it was already queued) must not close the connection.
            generation += 1
            let armed = generation
            let channel = context.channel
            timer = context.eventLoop.assumeIsolated().scheduleTask(in: amount) { [self] in
                guard generation == armed else { return }
                channel.close(promise: nil)
            }
        }
    }
}
