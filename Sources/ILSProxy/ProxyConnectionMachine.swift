import NIOCore
import NIOHTTP1

/// The lifecycle of one client connection of the streaming proxy, as a value: an event goes in, an action comes out,
/// and `ProxyServerHandler` does the I/O. Each exchange's own lifecycle is its `ExchangeMachine`.
///
/// It owns every deadline the connection has (idle, the backend's response head, the request body, the last
/// answer's close, a client that stopped reading); `nextDeadline` is the earliest, so the handler runs one timer
/// where it ran five. Generic over the backend connection so the tests drive it with a stand-in.
struct ProxyConnectionMachine<Backend: AnyObject> {
    struct Timeouts {
        /// No request in progress, and a request body that stopped arriving (`--idle-timeout`).
        var idle: TimeAmount
        /// The backend's response head (`--backend-header-timeout`).
        var header: TimeAmount
        /// A client that has taken nothing of a response (`clientStallTimeout`).
        var stall: TimeAmount
        /// The last answer before the connection closes.
        var closing: TimeAmount

        init(_ configuration: ProxyConfiguration, closing: TimeAmount) {
            idle = configuration.clientIdleTimeout.timeAmount
            header = configuration.backendHeaderTimeout.timeAmount
            stall = configuration.clientStallTimeout.timeAmount
            self.closing = closing
        }
    }

    enum State {
        /// Between requests, or reading a request head, since then.
        case idle(since: NIODeadline)
        /// The head arrived; waiting for a backend connection. Client reads are held.
        case awaitingBackend(Exchange)
        /// Streaming both ways.
        case forwarding(Exchange, Backend)
        /// The gateway answered itself (an error) or the response ended the connection; it closes once that answer
        /// is written, or when the closing deadline passes.
        case closing(since: NIODeadline)
        /// Waiting for both HTTP decoders to leave before bytes flow through the glue.
        case upgrading
        case closed
    }

    /// What the handler does after an event, of the things several events may ask for. An event with an answer of
    /// its own (a request part's fate, a lease, a response part) returns a small type that holds its own cases and
    /// one of these (`RequestPart`, `Lease`, `ResponseHead`, `ResponseBody`, `ResponseEnd`), as swift-nio-http2's
    /// state machines do: the handler's `perform` takes only these, so nothing an event never returns reaches it.
    enum Action {
        case none
        /// Close the client connection.
        case close
        /// The client took nothing for the stall timeout: log the exchange `client_stalled` (if one was under way),
        /// count it, and close the client connection; release the backend connection first, not reusable. No timer
        /// is left to run (as after `close`).
        case stalled(Exchange?, release: Backend?)
        /// Ask the pool for a backend connection for this exchange.
        case lease(Exchange)
        /// Answer with the gateway's own error, then close; release the backend connection first, not reusable.
        case respond(ProxyError, Exchange?, release: Backend?)
        /// Too late for a status: flush, log the exchange with `outcome`, close the client connection; release the
        /// backend connection first, not reusable.
        case cut(Exchange, outcome: String, release: Backend?)
        /// Flush what was written to the backend connection.
        case flushBackend(Backend)
        /// The exchange this connection came for is gone: return it to the pool unused.
        case returnUnused(Backend)
        /// Lease a new backend connection for the exchange (its buffer now holds only the request's end, if any).
        case retry(Exchange)
        /// The client went away mid-exchange: log it `client_closed`, close the backend connection if any.
        case abandon(Exchange, release: Backend?)
        /// Let the backend connection's reads through or hold them, as the client connection can take more or not.
        case setBackendReads(Backend, allowed: Bool)
    }

    /// Where a request part goes (`requestBody`, `requestEnd`).
    enum RequestPart {
        /// Nowhere: no exchange takes it.
        case none
        /// Keep it in the exchange until a backend connection is ready.
        case buffer(Exchange)
        /// Write it to the backend connection.
        case forward(Backend)
    }

    /// The pool's answer to a lease (`leased`).
    enum Lease {
        /// The exchange has its backend connection: write `100 Continue` if asked, the head and what was buffered,
        /// then pass on a held read if asked.
        case startForwarding(Exchange, Backend, writeContinue: Bool, resumeRead: Bool)
        case other(Action)
    }

    /// The backend's response head (`responseHead`).
    enum ResponseHead {
        /// Write the response head to the client.
        case writeHead(Exchange, closeClient: Bool)
        case other(Action)
    }

    /// A part of the backend's response body (`responseBody`).
    enum ResponseBody {
        /// Write the part to the client.
        case writeBody
        case other(Action)
    }

    /// The end of the backend's response (`responseEnd`).
    enum ResponseEnd {
        /// The exchange is over: release the backend connection (`reuseBackend`), log, pass on a held read if
        /// asked, then write the response's end and close after it if `closeClient`.
        case finish(Exchange, Backend, reuseBackend: Bool, closeClient: Bool, resumeRead: Bool)
        /// Switch both connections to opaque bytes (the 101 is written once both decoders left).
        case upgrade(Exchange, Backend, HTTPResponseHead)
        case other(Action)
    }

    private(set) var state: State
    let timeouts: Timeouts
    /// The pipeline asked for a read while the request could not move on (no backend connection, or one that cannot
    /// take more); passed on when it can.
    private(set) var readHeld = false
    /// The last time the request body moved (or could not, through no fault of the client's).
    private(set) var bodyProgress: NIODeadline
    /// Since when the client connection has not been writable.
    private(set) var stalledSince: NIODeadline?
    /// The client half-closed (`clientInputClosed`): no further request will come.
    private(set) var inputEnded = false
    private var backendNeedsFlush = false
    private var clientNeedsFlush = false

    init(timeouts: Timeouts, now: NIODeadline) {
        self.timeouts = timeouts
        self.state = .idle(since: now)
        self.bodyProgress = now
    }

    /// The earliest deadline the connection has now, or nil for none.
    var nextDeadline: NIODeadline? {
        let stall = stalledSince.map { $0 + timeouts.stall }
        switch state {
        case .idle(let since):
            return Self.earliest(stall, since + timeouts.idle)
        case .closing(let since):
            return Self.earliest(stall, since + timeouts.closing)
        case .awaitingBackend(let exchange):
            return Self.earliest(stall, exchange.machine.awaitsRequestBody ? bodyProgress + timeouts.idle : nil)
        case .forwarding(let exchange, _):
            let body = exchange.machine.awaitsRequestBody ? bodyProgress + timeouts.idle : nil
            return Self.earliest(stall, Self.earliest(exchange.machine.headerDeadline, body))
        case .upgrading, .closed:
            return stall
        }
    }

    private static func earliest(_ first: NIODeadline?, _ second: NIODeadline?) -> NIODeadline? {
        guard let first else { return second }
        guard let second else { return first }
        return Swift.min(first, second)
    }

    // MARK: Client connection events

    /// The connection is up: the idle deadline starts now.
    mutating func channelActive(now: NIODeadline) {
        if case .idle = state { state = .idle(since: now) }
    }

    /// A request head arrived. `makeExchange` (the header rewrite) runs only when a request can start.
    mutating func requestHead(now: NIODeadline, makeExchange: () -> Exchange) -> Action {
        switch state {
        case .idle:
            break
        case .closing:
            // A pipelined request behind one that closes the connection is not answered; the close is on its way.
            return .none
        case .awaitingBackend, .forwarding, .upgrading, .closed:
            // HTTPServerPipelineHandler serialises requests, so a second head mid-exchange is a broken pipeline.
            return .close
        }
        let exchange = makeExchange()
        if let refusal = exchange.refusal { return refuse(refusal, exchange, release: nil, now: now) }
        state = .awaitingBackend(exchange)
        bodyProgress = now
        return .lease(exchange)
    }

    mutating func requestBody(bytes: Int, now: NIODeadline) -> RequestPart {
        switch state {
        case .awaitingBackend(let exchange):
            exchange.bytesIn += bytes
            return .buffer(exchange)
        case .forwarding(let exchange, let backend):
            exchange.bytesIn += bytes
            backendNeedsFlush = true
            bodyProgress = now
            return .forward(backend)
        case .idle, .closing, .upgrading, .closed:
            return .none
        }
    }

    mutating func requestEnd() -> RequestPart {
        switch state {
        case .awaitingBackend(let exchange):
            exchange.machine.requestEnded()
            return .buffer(exchange)
        case .forwarding(let exchange, let backend):
            exchange.machine.requestEnded()
            backendNeedsFlush = true
            return .forward(backend)
        case .idle, .closing, .upgrading, .closed:
            return .none
        }
    }

    /// The end of a read burst from the client: what it wrote to the backend goes out now.
    mutating func readComplete() -> Action {
        guard backendNeedsFlush else { return .none }
        backendNeedsFlush = false
        if case .forwarding(_, let backend) = state { return .flushBackend(backend) }
        return .none
    }

    /// The pipeline asks for a read; returns whether it goes through now (otherwise it is held).
    mutating func read(backendWritable: Bool) -> Bool {
        switch state {
        case .idle, .closing, .upgrading, .closed:
            return true
        case .awaitingBackend:
            readHeld = true
            return false
        case .forwarding:
            guard backendWritable else {
                readHeld = true
                return false
            }
            return true
        }
    }

    mutating func clientWritabilityChanged(isWritable: Bool, now: NIODeadline) -> Action {
        if isWritable {
            stalledSince = nil
        } else if stalledSince == nil {
            stalledSince = now
        }
        if case .forwarding(_, let backend) = state { return .setBackendReads(backend, allowed: isWritable) }
        return .none
    }

    /// The client has nothing more to send: a half-close (through a circuit, the device's FINAL; plain TCP
    /// connections close instead). Between exchanges the connection ends now, which through a circuit is the
    /// gateway's FINAL, rather than at the idle timeout; during one it ends after the response, as with
    /// `Connection: close`.
    mutating func clientInputClosed(now: NIODeadline) -> Action {
        inputEnded = true
        guard case .idle = state else { return .none }
        state = .closing(since: now)
        return .close
    }

    mutating func clientInactive() -> Action {
        defer { state = .closed }
        switch state {
        case .forwarding(let exchange, let backend):
            // Close the backend request now, so a generation stops and costs nothing more.
            return .abandon(exchange, release: backend)
        case .awaitingBackend(let exchange):
            return .abandon(exchange, release: nil)
        case .idle, .closing, .upgrading, .closed:
            return .none
        }
    }

    /// The client's bytes are not HTTP; `answer` is the error for them.
    mutating func requestParseFailed(_ answer: ProxyError, now: NIODeadline) -> Action {
        switch state {
        case .closing:
            // While the last answer is being written, later garbage must not cut it short.
            return .none
        case .idle:
            return refuse(answer, nil, release: nil, now: now)
        case .awaitingBackend(let exchange) where !exchange.machine.responseHeadSent:
            return refuse(answer, exchange, release: nil, now: now)
        case .forwarding(let exchange, let backend) where !exchange.machine.responseHeadSent:
            return refuse(answer, exchange, release: backend, now: now)
        case .awaitingBackend, .forwarding, .upgrading, .closed:
            return .close
        }
    }

    // MARK: The backend connection

    /// The pool answered a lease for `exchange`.
    mutating func leased(
        _ exchange: Exchange,
        _ result: Result<Backend, ProxyError>,
        reused: Bool,
        backendWritable: Bool,
        now: NIODeadline
    ) -> Lease {
        guard case .awaitingBackend(let current) = state, current === exchange else {
            // The client left (or the exchange ended) while we waited: hand the connection straight back.
            if case .success(let backend) = result { return .other(.returnUnused(backend)) }
            return .other(.none)
        }
        switch result {
        case .failure(let error):
            return .other(refuse(error, exchange, release: nil, now: now))
        case .success(let backend):
            state = .forwarding(exchange, backend)
            let writeContinue = exchange.machine.backendAssigned(reused: reused, headerDeadline: now + timeouts.header)
            let resumeRead = readHeld && backendWritable
            if resumeRead { readHeld = false }
            return .startForwarding(exchange, backend, writeContinue: writeContinue, resumeRead: resumeRead)
        }
    }

    mutating func responseHead(_ head: HTTPResponseHead, now: NIODeadline) -> ResponseHead {
        guard case .forwarding(let exchange, let backend) = state else { return .other(.none) }
        switch exchange.machine.responseHead(head) {
        case .forward(let closeClient):
            exchange.status = head.status
            clientNeedsFlush = true
            return .writeHead(exchange, closeClient: closeClient)
        case .holdSwitch:
            return .other(.none)
        case .refuse(let error):
            return .other(refuse(error, exchange, release: backend, now: now))
        }
    }

    mutating func responseBody(bytes: Int, now: NIODeadline) -> ResponseBody {
        guard case .forwarding(let exchange, let backend) = state else { return .other(.none) }
        guard exchange.machine.responseHeadSent else {
            // A body before any head (or inside a held 101): the backend's framing is broken.
            return .other(refuse(.backendInvalidResponse, exchange, release: backend, now: now))
        }
        exchange.bytesOut += bytes
        clientNeedsFlush = true
        return .writeBody
    }

    mutating func responseEnd(now: NIODeadline) -> ResponseEnd {
        guard case .forwarding(let exchange, let backend) = state else { return .other(.none) }
        switch exchange.machine.responseEnded() {
        case .upgrade where inputEnded:
            // The client's end came before the switch: there is nothing to carry its bytes, and the backend would
            // never learn that end through the glue. A cut, as an unsealed end after a 101 is.
            state = .closing(since: now)
            return .other(.cut(exchange, outcome: "client_closed", release: backend))
        case .upgrade(let head):
            state = .upgrading
            exchange.status = head.status
            return .upgrade(exchange, backend, head)
        case .finish(let reuseBackend, let keepAliveEnds):
            // The client said it has nothing more to send: this answer is the last.
            let closeClient = keepAliveEnds || inputEnded
            // The end's write flushes; once released, the backend connection no longer reports its read completion.
            clientNeedsFlush = false
            let resumeRead: Bool
            if closeClient {
                state = .closing(since: now)
                resumeRead = false
            } else {
                state = .idle(since: now)
                resumeRead = readHeld
                readHeld = false
            }
            return .finish(
                exchange,
                backend,
                reuseBackend: reuseBackend,
                closeClient: closeClient,
                resumeRead: resumeRead
            )
        case .refuse(let error):
            return .other(refuse(error, exchange, release: backend, now: now))
        }
    }

    /// The end of a read burst from the backend; returns whether the client connection needs a flush.
    mutating func backendReadComplete() -> Bool {
        defer { clientNeedsFlush = false }
        return clientNeedsFlush
    }

    /// The backend connection can take more again; returns whether a held client read goes through now.
    mutating func backendBecameWritable() -> Bool {
        guard readHeld, case .forwarding = state else { return false }
        readHeld = false
        return true
    }

    mutating func backendClosed(invalidResponse: Bool, now: NIODeadline) -> Action {
        guard case .forwarding(let exchange, _) = state else { return .none }
        switch exchange.machine.backendClosed(invalidResponse: invalidResponse) {
        case .retry:
            state = .awaitingBackend(exchange)
            return .retry(exchange)
        case .cut:
            // Ending the client connection (not a clean chunked end) tells the client the response is truncated.
            state = .closing(since: now)
            return .cut(exchange, outcome: "backend_closed_mid_response", release: nil)
        case .refuse(let error):
            return refuse(error, exchange, release: nil, now: now)
        }
    }

    // MARK: Time

    /// The connection's timer fired: acts on every deadline that has passed. The handler schedules the timer again
    /// at `nextDeadline`.
    mutating func timerFired(now: NIODeadline, backendWritable: Bool) -> Action {
        if let stalledSince, stalledSince + timeouts.stall <= now {
            // Not writable since then: the client stopped reading. The backend request ends with it.
            defer { state = .closed }
            switch state {
            case .forwarding(let exchange, let backend): return .stalled(exchange, release: backend)
            case .awaitingBackend(let exchange): return .stalled(exchange, release: nil)
            case .idle, .closing, .upgrading, .closed: return .stalled(nil, release: nil)
            }
        }
        switch state {
        case .idle(let since):
            return since + timeouts.idle <= now ? .close : .none
        case .closing(let since):
            return since + timeouts.closing <= now ? .close : .none
        case .awaitingBackend(let exchange):
            // Client reads are held while no backend connection is ready: the silence is ours, not the client's.
            if exchange.machine.awaitsRequestBody { bodyProgress = Swift.max(bodyProgress, now) }
            return .none
        case .forwarding(let exchange, let backend):
            if let due = exchange.machine.headerDeadline, due <= now {
                return refuse(.backendTimeout, exchange, release: backend, now: now)
            }
            guard exchange.machine.awaitsRequestBody, bodyProgress + timeouts.idle <= now else { return .none }
            if readHeld || !backendWritable {
                // Held by backpressure from the backend, not stalled by the client.
                bodyProgress = now
                return .none
            }
            return refuse(.requestBodyTimeout, exchange, release: backend, now: now)
        case .upgrading, .closed:
            return .none
        }
    }

    /// The gateway ends the exchange itself: with its own answer, or, once the response head was sent, with a cut.
    private mutating func refuse(
        _ error: ProxyError,
        _ exchange: Exchange?,
        release backend: Backend?,
        now: NIODeadline
    ) -> Action {
        state = .closing(since: now)
        if let exchange, exchange.machine.responseHeadSent {
            return .cut(exchange, outcome: error.code, release: backend)
        }
        return .respond(error, exchange, release: backend)
    }
}
