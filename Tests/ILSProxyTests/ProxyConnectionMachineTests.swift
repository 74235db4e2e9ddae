import ILSCore
import NIOCore
import NIOHTTP1
import Testing

@testable import ILSProxy

/// A client connection's lifecycle, driven through `ProxyConnectionMachine` alone with a stand-in backend: one test
/// per transition (T1–T21 in docs/design/data-path.md). Actions and states are compared by name
/// (`ProxyConnectionMachineTableTests.name`), with "release" when a backend connection is released.
@Suite("ProxyConnectionMachine: one client connection's lifecycle")
struct ProxyConnectionMachineTests {
    final class Backend {}
    typealias Machine = ProxyConnectionMachine<Backend>

    static let start = NIODeadline.uptimeNanoseconds(1_000_000_000_000)
    static let timeouts: Machine.Timeouts = {
        var configuration = ProxyConfiguration(backend: BackendURL(host: "127.0.0.1", port: 8000))
        configuration.clientIdleTimeout = .seconds(60)
        configuration.backendHeaderTimeout = .seconds(300)
        configuration.clientStallTimeout = .seconds(600)
        return Machine.Timeouts(configuration, closing: .seconds(30))
    }()

    static func exchange(
        _ method: HTTPMethod = .GET,
        version: HTTPVersion = .http1_1,
        body: Bool = false,
        upgrade: Bool = false,
        clientWantsClose: Bool = false,
        expect: Bool = false,
        refusal: ProxyError? = nil
    ) -> Exchange {
        var head = HTTPRequestHead(version: version, method: method, uri: "/query?secret=1")
        if expect { head.headers.add(name: "Expect", value: "100-continue") }
        let forwarded = ForwardedRequest(
            head: head,
            isUpgrade: upgrade,
            hasBody: body,
            clientWantsClose: clientWantsClose
        )
        return Exchange(head: head, rewrite: refusal.map { .failure($0) } ?? .success(forwarded), startedAt: start)
    }

    static func head(_ status: HTTPResponseStatus, keepAlive: Bool = true) -> HTTPResponseHead {
        var head = HTTPResponseHead(version: .http1_1, status: status)
        if !keepAlive { head.headers.add(name: "Connection", value: "close") }
        return head
    }

    /// A machine with `exchange` leased onto `backend` (and the head and end of a body-less request read).
    static func forwarding(
        _ exchange: Exchange = exchange(),
        reused: Bool = false,
        backend: Backend = Backend()
    ) -> Machine {
        var machine = Machine(timeouts: timeouts, now: start)
        _ = machine.requestHead(now: start) { exchange }
        // A request with a body: its end comes later.
        if exchange.forwarded?.hasBody != true { _ = machine.requestEnd() }
        _ = machine.leased(exchange, .success(backend), reused: reused, backendWritable: true, now: start)
        return machine
    }

    typealias Table = ProxyConnectionMachineTableTests

    static func name(_ action: Machine.Action) -> String { Table.name(action) }
    static func name(_ part: Machine.RequestPart) -> String { Table.name(part) }
    static func name(_ lease: Machine.Lease) -> String { Table.name(lease) }
    static func name(_ head: Machine.ResponseHead) -> String { Table.name(head) }
    static func name(_ body: Machine.ResponseBody) -> String { Table.name(body) }
    static func name(_ end: Machine.ResponseEnd) -> String { Table.name(end) }

    static func name(_ state: Machine.State) -> String { Table.name(state) }

    /// The exchange the state holds, if any.
    static func current(_ state: Machine.State) -> Exchange? {
        switch state {
        case .awaitingBackend(let exchange), .forwarding(let exchange, _): exchange
        case .idle, .closing, .upgrading, .closed: nil
        }
    }

    /// The backend connection an action carries (to lease, release or write to), if any.
    static func backend(_ action: Machine.Action) -> Backend? {
        switch action {
        case .respond(_, _, let backend), .cut(_, _, let backend), .abandon(_, let backend), .stalled(_, let backend):
            backend
        case .flushBackend(let backend), .returnUnused(let backend), .setBackendReads(let backend, _): backend
        case .none, .close, .lease, .retry: nil
        }
    }

    static func backend(_ part: Machine.RequestPart) -> Backend? {
        if case .forward(let backend) = part { return backend }
        return nil
    }

    static func backend(_ lease: Machine.Lease) -> Backend? {
        switch lease {
        case .startForwarding(_, let backend, _, _): backend
        case .other(let action): backend(action)
        }
    }

    static func backend(_ end: Machine.ResponseEnd) -> Backend? {
        switch end {
        case .finish(_, let backend, _, _, _), .upgrade(_, let backend, _): backend
        case .other(let action): backend(action)
        }
    }

    static func backend(_ head: Machine.ResponseHead) -> Backend? {
        if case .other(let action) = head { return backend(action) }
        return nil
    }

    static func backend(_ body: Machine.ResponseBody) -> Backend? {
        if case .other(let action) = body { return backend(action) }
        return nil
    }

    // MARK: T1–T4: a request head

    @Test("T1: a head on an idle connection starts an exchange and leases a backend connection")
    func t1() {
        var machine = Machine(timeouts: Self.timeouts, now: Self.start)
        let exchange = Self.exchange()
        #expect(Self.name(machine.requestHead(now: Self.start + .seconds(1)) { exchange }) == "lease")
        #expect(Self.current(machine.state) === exchange)
        #expect(Self.name(machine.state) == "awaitingBackend")
        #expect(machine.bodyProgress == Self.start + .seconds(1))
    }

    @Test("T2: a head the rewrite refuses is answered by the gateway, and the connection closes after")
    func t2() {
        var machine = Machine(timeouts: Self.timeouts, now: Self.start)
        let action = machine.requestHead(now: Self.start) { Self.exchange(refusal: .invalidTarget) }
        #expect(Self.name(action) == "respond(invalid_target)")
        #expect(Self.name(machine.state) == "closing")
        #expect(machine.nextDeadline == Self.start + .seconds(30))
    }

    @Test("T3: a head while the connection closes is ignored, and no exchange is made")
    func t3() {
        var machine = Machine(timeouts: Self.timeouts, now: Self.start)
        _ = machine.requestParseFailed(.malformedRequest, now: Self.start)
        var made = false
        let action = machine.requestHead(now: Self.start) {
            made = true
            return Self.exchange()
        }
        #expect(Self.name(action) == "none")
        #expect(!made)
        #expect(Self.name(machine.state) == "closing")
    }

    @Test("T4: a second head mid-exchange is a broken pipeline: the connection closes")
    func t4() {
        var made = false
        var waiting = Machine(timeouts: Self.timeouts, now: Self.start)
        _ = waiting.requestHead(now: Self.start) { Self.exchange() }
        for var machine in [waiting, Self.forwarding()] {
            let action = machine.requestHead(now: Self.start) {
                made = true
                return Self.exchange()
            }
            #expect(Self.name(action) == "close")
        }
        #expect(!made)
    }

    // MARK: T5–T7: the lease

    @Test("T5: a leased connection starts forwarding, writes 100 Continue once, and passes on a held read")
    func t5() {
        var machine = Machine(timeouts: Self.timeouts, now: Self.start)
        let exchange = Self.exchange(.POST, body: true, expect: true)
        _ = machine.requestHead(now: Self.start) { exchange }
        let passed = machine.read(backendWritable: true)
        #expect(!passed, "a read passed through with no backend connection")
        #expect(machine.readHeld)
        let backend = Backend()
        let action = machine.leased(exchange, .success(backend), reused: true, backendWritable: true, now: Self.start)
        #expect(Self.name(action) == "startForwarding(continue, resume)")
        #expect(Self.backend(action) === backend)
        #expect(!machine.readHeld)
        #expect(exchange.machine.attempt == .first(reused: true))
        #expect(exchange.machine.headerDeadline == Self.start + .seconds(300))
        #expect(Self.name(machine.state) == "awaitingHead")
        #expect(Self.current(machine.state) === exchange)
    }

    @Test("T5: a held read stays held while the new backend connection cannot take more")
    func t5Held() {
        var machine = Machine(timeouts: Self.timeouts, now: Self.start)
        let exchange = Self.exchange(.POST, body: true)
        _ = machine.requestHead(now: Self.start) { exchange }
        _ = machine.read(backendWritable: true)
        let action = machine.leased(
            exchange,
            .success(Backend()),
            reused: false,
            backendWritable: false,
            now: Self.start
        )
        #expect(Self.name(action) == "startForwarding(-, -)")
        #expect(machine.readHeld)
        let resumed = machine.backendBecameWritable()
        #expect(resumed)
        #expect(!machine.readHeld)
    }

    @Test("T6: a failed lease is answered with its error and the connection closes")
    func t6() {
        var machine = Machine(timeouts: Self.timeouts, now: Self.start)
        let exchange = Self.exchange()
        _ = machine.requestHead(now: Self.start) { exchange }
        let action = machine.leased(
            exchange,
            .failure(.backendBusy),
            reused: false,
            backendWritable: false,
            now: Self.start
        )
        #expect(Self.name(action) == "respond(backend_busy)")
        #expect(Self.name(machine.state) == "closing")
    }

    @Test("T7: a connection leased for an exchange that is gone goes back to the pool unused")
    func t7() {
        var machine = Machine(timeouts: Self.timeouts, now: Self.start)
        let exchange = Self.exchange()
        _ = machine.requestHead(now: Self.start) { exchange }
        _ = machine.clientInactive()
        let backend = Backend()
        let action = machine.leased(exchange, .success(backend), reused: false, backendWritable: true, now: Self.start)
        #expect(Self.name(action) == "returnUnused")
        #expect(Self.backend(action) === backend)
        #expect(Self.name(machine.state) == "closed")
        // A lease for another exchange, while this one waits, goes back too; its failure is not answered here.
        var waiting = Machine(timeouts: Self.timeouts, now: Self.start)
        _ = waiting.requestHead(now: Self.start) { Self.exchange() }
        let stranger = waiting.leased(
            Self.exchange(),
            .success(backend),
            reused: false,
            backendWritable: true,
            now: Self.start
        )
        #expect(Self.name(stranger) == "returnUnused")
        let failed = waiting.leased(
            Self.exchange(),
            .failure(.backendBusy),
            reused: false,
            backendWritable: true,
            now: Self.start
        )
        #expect(Self.name(failed) == "none")
        #expect(Self.name(waiting.state) == "awaitingBackend")
    }

    // MARK: T8–T9: the response ends

    @Test("a client that half-closes mid-exchange gets the rest of the answer, then the connection ends; idle, at once")
    func inputClosed() {
        let backend = Backend()
        let exchange = Self.exchange()
        var machine = Self.forwarding(exchange, backend: backend)
        #expect(Self.name(machine.clientInputClosed(now: Self.start)) == "none")
        #expect(Self.name(machine.responseHead(Self.head(.ok), now: Self.start)) == "writeHead(keep)")
        // A keep-alive answer, but the client said it sends nothing more: it is the last.
        #expect(Self.name(machine.responseEnd(now: Self.start)) == "finish(reuse, close, -)")
        #expect(Self.name(machine.state) == "closing")

        var idle = Machine(timeouts: Self.timeouts, now: Self.start)
        #expect(Self.name(idle.clientInputClosed(now: Self.start)) == "close")
        #expect(Self.name(idle.state) == "closing")

        // An upgrade whose client ended before the 101: nothing would carry that end to the backend. A cut.
        let upgrade = Self.exchange(upgrade: true)
        var switching = Self.forwarding(upgrade)
        _ = switching.clientInputClosed(now: Self.start)
        _ = switching.responseHead(Self.head(.switchingProtocols), now: Self.start)
        #expect(Self.name(switching.responseEnd(now: Self.start)) == "cut(client_closed, release)")
        #expect(Self.name(switching.state) == "closing")
    }

    @Test("T8: the response's end finishes the exchange, recycles the backend and idles, passing on a held read")
    func t8() {
        let backend = Backend()
        let exchange = Self.exchange()
        var machine = Self.forwarding(exchange, backend: backend)
        #expect(Self.name(machine.responseHead(Self.head(.ok), now: Self.start)) == "writeHead(keep)")
        #expect(exchange.status == .ok)
        #expect(Self.name(machine.responseBody(bytes: 5, now: Self.start)) == "writeBody")
        #expect(exchange.bytesOut == 5)
        let passed = machine.read(backendWritable: false)
        #expect(!passed)
        let end = Self.start + .seconds(2)
        let action = machine.responseEnd(now: end)
        #expect(Self.name(action) == "finish(reuse, keep, resume)")
        #expect(Self.backend(action) === backend)
        #expect(Self.name(machine.state) == "idle")
        #expect(machine.nextDeadline == end + .seconds(60))
        #expect(!machine.readHeld)
        let flush = machine.backendReadComplete()
        #expect(!flush, "a flush was still owed after the end's own flush")
    }

    @Test("T9: an end that closes the client (HTTP/1.0, Connection: close, a body left unread) moves to closing")
    func t9() {
        let cases: [(Exchange, String)] = [
            (Self.exchange(version: .http1_0), "finish(reuse, close, -)"),
            (Self.exchange(clientWantsClose: true), "finish(reuse, close, -)"),
            (Self.exchange(.POST, body: true), "finish(drop, close, -)"),
        ]
        for (exchange, expected) in cases {
            var machine = Self.forwarding(exchange)
            _ = machine.responseHead(Self.head(.ok), now: Self.start)
            _ = machine.read(backendWritable: false)
            #expect(Self.name(machine.responseEnd(now: Self.start)) == expected)
            #expect(Self.name(machine.state) == "closing")
        }
    }

    // MARK: T10–T12: the backend connection closes

    @Test("T10: a reused connection closing before the head sends the request again; the second close is a 502")
    func t10() {
        let exchange = Self.exchange()
        var machine = Self.forwarding(exchange, reused: true)
        #expect(Self.name(machine.backendClosed(invalidResponse: false, now: Self.start)) == "retry")
        #expect(Self.name(machine.state) == "awaitingBackend")
        #expect(Self.current(machine.state) === exchange)
        _ = machine.leased(exchange, .success(Backend()), reused: true, backendWritable: true, now: Self.start)
        #expect(Self.name(machine.backendClosed(invalidResponse: false, now: Self.start)) == "respond(backend_reset)")
    }

    @Test("T11: a backend that dies mid-response is a cut, never a clean end")
    func t11() {
        var machine = Self.forwarding()
        _ = machine.responseHead(Self.head(.ok), now: Self.start)
        let action = machine.backendClosed(invalidResponse: false, now: Self.start)
        #expect(Self.name(action) == "cut(backend_closed_mid_response)")
        #expect(Self.name(machine.state) == "closing")
    }

    @Test("T12: a close or garbage before the head is answered 502, not retried on a fresh connection")
    func t12() {
        var reset = Self.forwarding(reused: false)
        #expect(Self.name(reset.backendClosed(invalidResponse: false, now: Self.start)) == "respond(backend_reset)")
        var invalid = Self.forwarding(reused: true)
        let action = invalid.backendClosed(invalidResponse: true, now: Self.start)
        #expect(Self.name(action) == "respond(backend_invalid_response)")
        #expect(Self.name(invalid.state) == "closing")
    }

    // MARK: T13–T14: deadlines of an exchange

    @Test("T13: no response head by the header deadline is a 504, and the backend connection is closed")
    func t13() {
        let backend = Backend()
        var machine = Self.forwarding(backend: backend)
        #expect(machine.nextDeadline == Self.start + .seconds(300))
        #expect(Self.name(machine.timerFired(now: Self.start + .seconds(299), backendWritable: true)) == "none")
        let action = machine.timerFired(now: Self.start + .seconds(300), backendWritable: true)
        #expect(Self.name(action) == "respond(backend_timeout, release)")
        #expect(Self.backend(action) === backend)
        #expect(Self.name(machine.state) == "closing")
    }

    @Test("T14: a request body that stops arriving is a 408, unless backpressure holds it or no backend is ready")
    func t14() {
        let exchange = Self.exchange(.POST, body: true)
        var machine = Self.forwarding(exchange)
        #expect(Self.name(machine.requestBody(bytes: 10, now: Self.start + .seconds(10))) == "forward")
        #expect(exchange.bytesIn == 10)
        #expect(machine.nextDeadline == Self.start + .seconds(70))
        // Held by the backend: the deadline moves instead.
        #expect(Self.name(machine.timerFired(now: Self.start + .seconds(70), backendWritable: false)) == "none")
        #expect(machine.bodyProgress == Self.start + .seconds(70))
        let action = machine.timerFired(now: Self.start + .seconds(130), backendWritable: true)
        #expect(Self.name(action) == "respond(request_timeout, release)")
        // While no backend connection is ready, reads are held: the silence is the gateway's.
        var waiting = Machine(timeouts: Self.timeouts, now: Self.start)
        _ = waiting.requestHead(now: Self.start) { Self.exchange(.POST, body: true) }
        #expect(Self.name(waiting.timerFired(now: Self.start + .seconds(100), backendWritable: false)) == "none")
        #expect(waiting.nextDeadline == Self.start + .seconds(160))
    }

    // MARK: T15–T17: protocol switches

    @Test("T15: a 101 to a request that did not ask to switch is a 502, and the backend connection is closed")
    func t15() {
        var machine = Self.forwarding()
        let action = machine.responseHead(Self.head(.switchingProtocols), now: Self.start)
        #expect(Self.name(action) == "respond(backend_invalid_response, release)")
    }

    @Test("T16: an upgrade's 101 is held until its end, then both connections switch")
    func t16() {
        let exchange = Self.exchange(upgrade: true)
        var machine = Self.forwarding(exchange)
        let held = machine.responseHead(Self.head(.switchingProtocols), now: Self.start)
        #expect(Self.name(held) == "none", "the 101 went out before its end")
        let action = machine.responseEnd(now: Self.start)
        #expect(Self.name(action) == "upgrade")
        guard case .upgrade(let upgraded, _, let head) = action else { return }
        #expect(upgraded === exchange)
        #expect(head.status == .switchingProtocols)
        #expect(exchange.status == .switchingProtocols)
        #expect(Self.name(machine.state) == "upgrading")
        #expect(machine.nextDeadline == nil)
    }

    @Test("T17: a client gone during the switch leaves nothing to release; the switch then finds the state closed")
    func t17() {
        var machine = Self.forwarding(Self.exchange(upgrade: true))
        _ = machine.responseHead(Self.head(.switchingProtocols), now: Self.start)
        _ = machine.responseEnd(now: Self.start)
        #expect(Self.name(machine.clientInactive()) == "none")
        #expect(Self.name(machine.state) == "closed")
    }

    // MARK: T18–T20

    @Test("T18: the client going away closes the backend request and logs it client_closed")
    func t18() {
        var forwarding = Self.forwarding()
        #expect(Self.name(forwarding.clientInactive()) == "abandon(release)")
        #expect(Self.name(forwarding.state) == "closed")
        var waiting = Machine(timeouts: Self.timeouts, now: Self.start)
        _ = waiting.requestHead(now: Self.start) { Self.exchange() }
        #expect(Self.name(waiting.clientInactive()) == "abandon")
        var idle = Machine(timeouts: Self.timeouts, now: Self.start)
        #expect(Self.name(idle.clientInactive()) == "none")
        #expect(idle.nextDeadline == nil)
    }

    @Test("T19: the client's bytes failing to parse are a 400 or 431 until the response started, then a close")
    func t19() {
        var idle = Machine(timeouts: Self.timeouts, now: Self.start)
        #expect(Self.name(idle.requestParseFailed(.headersTooLarge, now: Self.start)) == "respond(headers_too_large)")
        var forwarding = Self.forwarding(Self.exchange(.POST, body: true))
        let action = forwarding.requestParseFailed(.malformedRequest, now: Self.start)
        #expect(Self.name(action) == "respond(malformed_request, release)")
        var streaming = Self.forwarding(Self.exchange(.POST, body: true))
        _ = streaming.responseHead(Self.head(.ok), now: Self.start)
        #expect(Self.name(streaming.requestParseFailed(.malformedRequest, now: Self.start)) == "close")
        // While the last answer is written, later garbage must not cut it short.
        var closing = Machine(timeouts: Self.timeouts, now: Self.start)
        _ = closing.requestParseFailed(.malformedRequest, now: Self.start)
        #expect(Self.name(closing.requestParseFailed(.malformedRequest, now: Self.start)) == "none")
    }

    @Test("T20: the gateway ending an exchange whose head was sent cuts it, with the error as its outcome")
    func t20() {
        var machine = Self.forwarding()
        _ = machine.responseHead(Self.head(.ok), now: Self.start)
        let action = machine.responseHead(Self.head(.ok), now: Self.start)
        #expect(Self.name(action) == "cut(backend_invalid_response, release)")
        #expect(Self.name(machine.state) == "closing")
    }

    // MARK: The connection's own deadlines and flow control

    @Test("an idle connection closes at the idle deadline, a closing one at the closing deadline")
    func idleAndClosing() {
        var idle = Machine(timeouts: Self.timeouts, now: Self.start)
        #expect(idle.nextDeadline == Self.start + .seconds(60))
        #expect(Self.name(idle.timerFired(now: Self.start + .seconds(59), backendWritable: false)) == "none")
        #expect(Self.name(idle.timerFired(now: Self.start + .seconds(60), backendWritable: false)) == "close")
        var closing = Machine(timeouts: Self.timeouts, now: Self.start)
        _ = closing.requestParseFailed(.malformedRequest, now: Self.start)
        #expect(closing.nextDeadline == Self.start + .seconds(30))
        #expect(Self.name(closing.timerFired(now: Self.start + .seconds(30), backendWritable: false)) == "close")
    }

    @Test("a client that takes nothing for the stall timeout is cut with its backend request; taking again clears it")
    func stall() {
        var machine = Self.forwarding()
        _ = machine.responseHead(Self.head(.ok), now: Self.start)
        #expect(machine.nextDeadline == nil)
        let held = machine.clientWritabilityChanged(isWritable: false, now: Self.start)
        #expect(Self.name(held) == "setBackendReads(false)")
        _ = machine.clientWritabilityChanged(isWritable: false, now: Self.start + .seconds(100))
        #expect(machine.nextDeadline == Self.start + .seconds(600))
        var cut = machine
        #expect(
            Self.name(cut.timerFired(now: Self.start + .seconds(600), backendWritable: true))
                == "stalled(exchange, release)"
        )
        #expect(Self.name(cut.state) == "closed")
        #expect(Self.name(cut.clientInactive()) == "none", "the stall logged the exchange: the close must not again")
        let resumed = machine.clientWritabilityChanged(isWritable: true, now: Self.start)
        #expect(Self.name(resumed) == "setBackendReads(true)")
        #expect(machine.stalledSince == nil)
        #expect(machine.nextDeadline == nil)
    }

    @Test("the next deadline is the earliest: header against body against stall")
    func earliest() {
        var machine = Self.forwarding(Self.exchange(.POST, body: true))
        #expect(machine.nextDeadline == Self.start + .seconds(60))
        _ = machine.requestEnd()
        #expect(machine.nextDeadline == Self.start + .seconds(300))
        _ = machine.clientWritabilityChanged(isWritable: false, now: Self.start - .seconds(500))
        #expect(machine.nextDeadline == Self.start + .seconds(100))
    }

    @Test("client writes are flushed once per burst, and the client once per backend burst")
    func flushes() {
        let backend = Backend()
        var machine = Self.forwarding(Self.exchange(.POST, body: true), backend: backend)
        #expect(Self.name(machine.readComplete()) == "none", "flushed with nothing written")
        #expect(Self.name(machine.requestBody(bytes: 1, now: Self.start)) == "forward")
        #expect(Self.name(machine.requestEnd()) == "forward")
        let flush = machine.readComplete()
        #expect(Self.name(flush) == "flushBackend")
        #expect(Self.backend(flush) === backend)
        #expect(Self.name(machine.readComplete()) == "none", "flushed twice")
        var owed = machine.backendReadComplete()
        #expect(!owed)
        _ = machine.responseHead(Self.head(.ok), now: Self.start)
        owed = machine.backendReadComplete()
        #expect(owed)
        owed = machine.backendReadComplete()
        #expect(!owed)
    }

    @Test("parts that arrive before a backend connection are buffered; reads pass only with somewhere to go")
    func buffering() {
        var machine = Machine(timeouts: Self.timeouts, now: Self.start)
        var passed = machine.read(backendWritable: false)
        #expect(passed)
        let exchange = Self.exchange(.POST, body: true)
        _ = machine.requestHead(now: Self.start) { exchange }
        #expect(Self.name(machine.requestBody(bytes: 7, now: Self.start)) == "buffer")
        #expect(Self.name(machine.requestEnd()) == "buffer")
        #expect(exchange.bytesIn == 7)
        #expect(exchange.machine.request == .complete)
        passed = machine.read(backendWritable: true)
        #expect(!passed)
        let resumed = machine.backendBecameWritable()
        #expect(!resumed, "a read went through with no backend connection")
    }
}
