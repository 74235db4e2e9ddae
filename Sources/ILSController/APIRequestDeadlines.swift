public import NIOCore

/// The deadlines of one API connection, as a state machine that takes events and says what to do; the
/// `APIRequestDeadlineHandler` drives it with a channel's bytes and timer, and tests drive it with plain values.
///
/// Every deadline is fixed when its phase starts and never moves with the bytes that arrive: a read timeout that
/// resets on every byte let a client that sent one header line, or one body byte, every 20 s hold a connection (and
/// its descriptor and buffers) for ever. The phases:
/// - the first request's head must be complete `head` after the connection starts (after TLS);
/// - a later request's head, `head` after its first byte;
/// - a request's body, `body` after its head;
/// - between requests a keep-alive connection may sit idle for `idle`.
///
/// A connection past a deadline while a request is partly in is answered 408 (RFC 9110 §15.5.9) and closed; one
/// with no request started is closed without an answer, as an idle keep-alive connection is.
public struct APIRequestDeadlines: Sendable {
    /// How long each phase may take.
    public struct Timeouts: Sendable, Hashable {
        public var head: TimeAmount
        public var body: TimeAmount
        public var idle: TimeAmount

        public init(head: TimeAmount, body: TimeAmount, idle: TimeAmount) {
            self.head = head
            self.body = body
            self.idle = idle
        }
    }

    enum State: Equatable {
        /// The connection has started and its first request's head is due by the deadline, bytes or not.
        case firstRequest(headBy: NIODeadline, bytesSeen: Bool)
        /// Between requests: the next request's first byte is due by the deadline.
        case idle(until: NIODeadline)
        /// Part of a request head is in.
        case head(by: NIODeadline)
        /// The head is in; the body is due by the deadline.
        case body(by: NIODeadline)
        /// A deadline passed; nothing more is timed.
        case expired
    }

    /// What the handler does when its timer fires.
    enum Action: Equatable {
        /// The deadline has moved on (a new phase started since the timer was set): wait until then.
        case wait(until: NIODeadline)
        /// No request is partly in: close.
        case close
        /// A request is partly in: answer 408, then close.
        case answerTimeoutAndClose
    }

    private let timeouts: Timeouts
    private(set) var state: State

    init(timeouts: Timeouts, startedAt now: NIODeadline) {
        self.timeouts = timeouts
        self.state = .firstRequest(headBy: now + timeouts.head, bytesSeen: false)
    }

    /// When the current phase ends, if one is timed.
    var deadline: NIODeadline? {
        switch state {
        case .firstRequest(let deadline, _), .idle(let deadline), .head(let deadline), .body(let deadline):
            return deadline
        case .expired:
            return nil
        }
    }

    /// Bytes of the connection arrived. Only the first byte after an idle spell starts a phase.
    mutating func bytesArrived(now: NIODeadline) {
        switch state {
        case .firstRequest(let deadline, _):
            state = .firstRequest(headBy: deadline, bytesSeen: true)
        case .idle:
            state = .head(by: now + timeouts.head)
        case .head, .body, .expired:
            break
        }
    }

    /// The HTTP decoder produced a request head: the body's deadline starts.
    mutating func headReceived(now: NIODeadline) {
        guard state != .expired else { return }
        state = .body(by: now + timeouts.body)
    }

    /// The answer to a request was written: the connection is idle until the next request's first byte.
    mutating func responseSent(now: NIODeadline) {
        guard state != .expired else { return }
        state = .idle(until: now + timeouts.idle)
    }

    /// The timer set for `deadline` fired at `now`.
    mutating func timerFired(now: NIODeadline) -> Action {
        guard let deadline else { return .close }
        if now < deadline { return .wait(until: deadline) }
        let requestPartlyIn: Bool
        switch state {
        case .firstRequest(_, let bytesSeen): requestPartlyIn = bytesSeen
        case .head, .body: requestPartlyIn = true
        case .idle, .expired: requestPartlyIn = false
        }
        state = .expired
        return requestPartlyIn ? .answerTimeoutAndClose : .close
    }
}
