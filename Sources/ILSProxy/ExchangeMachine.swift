import NIOCore
import NIOHTTP1

/// The lifecycle of one request and its response, as a value: an event goes in, what to do comes out. No channel,
/// no clock and no I/O: `ProxyConnectionMachine` feeds it, and its tests drive it alone.
///
/// It replaces seven Bools (`requestComplete`, `responseHeadSent`, `responseComplete`, `closeAfterResponse`,
/// `backendKeepAlive`, `reusedConnection`, `expectsContinue`) whose combinations were partly impossible, with
/// enums whose every value is a state the exchange can be in.
struct ExchangeMachine: Sendable {
    /// The client's side: still sending its body, or done.
    enum Request: Equatable, Sendable {
        case receiving
        case complete
    }

    /// The backend's side, as the client sees it.
    enum Response: Equatable, Sendable {
        /// No response head yet. The deadline is set once the request head went to a backend connection.
        case awaitingHead(deadline: NIODeadline?)
        /// The backend accepted a protocol switch; its 101 waits for the response's `.end` before anything moves.
        case switching(HTTPResponseHead)
        /// The head went to the client (or the switch is under way); body parts follow.
        case streaming
        case complete
    }

    /// Whether a connection carries another exchange after this one.
    enum Persistence: Equatable, Sendable {
        case keepAlive
        case close
    }

    /// `Expect: 100-continue`, which the gateway answers itself once a backend connection is ready.
    enum Continue: Equatable, Sendable {
        case notAsked
        case owed
        case sent
    }

    /// Which backend connection the request is on.
    enum Attempt: Equatable, Sendable {
        case unassigned
        /// The first connection, and whether it had carried an earlier request.
        case first(reused: Bool)
        /// The second, after the first (reused) one closed before answering. There is never a third.
        case retried
    }

    private(set) var request = Request.receiving
    private(set) var response = Response.awaitingHead(deadline: nil)
    /// The client connection after this exchange.
    private(set) var client: Persistence
    /// The backend connection after this exchange.
    private(set) var backend = Persistence.keepAlive
    private(set) var expectation: Continue
    private(set) var attempt = Attempt.unassigned
    /// The client asked to switch protocols; its connection goes to the byte-level glue or closes.
    let isUpgrade: Bool
    /// Nothing but the head is sent, and the method is idempotent: the request may go to a second connection.
    let isReplayable: Bool
    /// An HTTP/1.0 request: the client connection closes after the response.
    let isHTTP10: Bool

    /// `forwarded` is nil for a request the gateway refused before it reached any backend.
    init(method: HTTPMethod, version: HTTPVersion, forwarded: ForwardedRequest?, expectsContinue: Bool) {
        let isUpgrade = forwarded?.isUpgrade ?? false
        self.isUpgrade = isUpgrade
        self.client = (forwarded?.clientWantsClose ?? true) || isUpgrade ? .close : .keepAlive
        self.expectation = expectsContinue ? .owed : .notAsked
        let idempotent: [HTTPMethod] = [.GET, .HEAD, .OPTIONS, .PUT, .DELETE]
        self.isReplayable =
            forwarded.map { !$0.hasBody && !$0.isUpgrade && idempotent.contains(method) } ?? false
        self.isHTTP10 = version.major == 1 && version.minor == 0
    }

    /// The response head went to the client: a status for the request is too late, only a cut can end it early.
    var responseHeadSent: Bool {
        switch response {
        case .streaming, .complete: true
        case .awaitingHead, .switching: false
        }
    }

    /// The request body is unfinished and nothing of the response was sent: the client's body deadline applies.
    var awaitsRequestBody: Bool { request == .receiving && !responseHeadSent }

    /// When the backend must have sent its response head by, while it has not.
    var headerDeadline: NIODeadline? {
        if case .awaitingHead(let deadline) = response { return deadline }
        return nil
    }

    /// A request may go to a second backend connection only when the first was a reused keep-alive connection that
    /// closed before answering (the backend may have closed it just as we sent), and nothing but the head, which we
    /// still have, was sent. Requests with a body are never replayed.
    var isRetryable: Bool {
        attempt == .first(reused: true) && isReplayable && !responseHeadSent
    }

    /// A backend connection is ready and the request head goes out on it now; the answer is due by `headerDeadline`.
    /// Returns whether the gateway writes `100 Continue` now (once per exchange).
    mutating func backendAssigned(reused: Bool, headerDeadline: NIODeadline) -> Bool {
        attempt = attempt == .unassigned ? .first(reused: reused) : .retried
        response = .awaitingHead(deadline: headerDeadline)
        guard expectation == .owed else { return false }
        expectation = .sent
        return true
    }

    mutating func requestEnded() {
        request = .complete
    }

    enum HeadAction: Equatable, Sendable {
        /// Write the head to the client; the connection closes after this response if `closeClient`.
        case forward(closeClient: Bool)
        /// A 101 to an upgrade: hold it until the response's `.end`.
        case holdSwitch
        /// The head breaks the exchange (a 101 nobody asked for, a second head): the gateway answers, or cuts.
        case refuse(ProxyError)
    }

    mutating func responseHead(_ head: HTTPResponseHead) -> HeadAction {
        guard case .awaitingHead = response else {
            backend = .close
            return .refuse(.backendInvalidResponse)
        }
        backend = head.isKeepAlive ? .keepAlive : .close
        if head.status == .switchingProtocols {
            guard isUpgrade else {
                // A 101 to a request that did not ask to switch: the connection's framing is gone.
                backend = .close
                return .refuse(.backendInvalidResponse)
            }
            response = .switching(head)
            return .holdSwitch
        }
        if isHTTP10 { client = .close }
        response = .streaming
        return .forward(closeClient: client == .close)
    }

    enum EndAction: Equatable, Sendable {
        /// Switch both connections to opaque bytes, then write the held 101.
        case upgrade(HTTPResponseHead)
        /// The exchange is over: recycle the backend connection if `reuseBackend`, and close the client connection
        /// after the response's end if `closeClient`.
        case finish(reuseBackend: Bool, closeClient: Bool)
        /// An end with no head before it, or a second end: the backend's framing is broken.
        case refuse(ProxyError)
    }

    mutating func responseEnded() -> EndAction {
        switch response {
        case .switching(let head):
            response = .streaming
            return .upgrade(head)
        case .awaitingHead, .complete:
            backend = .close
            return .refuse(.backendInvalidResponse)
        case .streaming:
            break
        }
        response = .complete
        if request == .receiving {
            // The backend answered before the request body ended (e.g. a 413): the backend connection's framing is
            // unknown and the client still sends a body nobody reads. End both.
            backend = .close
            client = .close
        }
        return .finish(reuseBackend: backend == .keepAlive && !isUpgrade, closeClient: client == .close)
    }

    enum ClosedAction: Equatable, Sendable {
        /// Send the request again on a new connection.
        case retry
        /// The response is under way: end the client connection so it sees the response is truncated.
        case cut
        /// Nothing was sent: answer with this error.
        case refuse(ProxyError)
    }

    /// The backend connection closed before the response ended (a reset, a close, or a response it could not parse).
    mutating func backendClosed(invalidResponse: Bool) -> ClosedAction {
        if !invalidResponse, isRetryable {
            response = .awaitingHead(deadline: nil)
            return .retry
        }
        if responseHeadSent { return .cut }
        return .refuse(invalidResponse ? .backendInvalidResponse : .backendReset)
    }
}
