import ILSCore
import NIOCore
import NIOHTTP1
import Testing

@testable import ILSProxy

/// A client connection's lifecycle, driven through `ProxyConnectionMachine` alone with a stand-in backend: one test
/// per transition (T1–T20 in docs/architecture.md, "HTTP mode's lifecycles"), then every event in every state.
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

    // MARK: T1–T4: a request head

    @Test("T1: a head on an idle connection starts an exchange and leases a backend connection")
    func t1() throws {
        var machine = Machine(timeouts: Self.timeouts, now: Self.start)
        let exchange = Self.exchange()
        let action = machine.requestHead(now: Self.start + .seconds(1)) { exchange }
        guard case .lease(let leased) = action, leased === exchange else {
            Issue.record("\(action)")
            return
        }
        guard case .awaitingBackend(let current) = machine.state, current === exchange else {
            Issue.record("\(machine.state)")
            return
        }
        #expect(machine.bodyProgress == Self.start + .seconds(1))
    }

    @Test("T2: a head the rewrite refuses is answered by the gateway, and the connection closes after")
    func t2() {
        var machine = Machine(timeouts: Self.timeouts, now: Self.start)
        let exchange = Self.exchange(refusal: .invalidTarget)
        let action = machine.requestHead(now: Self.start) { exchange }
        guard case .respond(let error, let answered?, nil) = action, answered === exchange else {
            Issue.record("\(action)")
            return
        }
        #expect(error == .invalidTarget)
        guard case .closing(let since) = machine.state else {
            Issue.record("\(machine.state)")
            return
        }
        #expect(since == Self.start)
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
        guard case .none = action else {
            Issue.record("\(action)")
            return
        }
        #expect(!made)
        guard case .closing = machine.state else {
            Issue.record("\(machine.state)")
            return
        }
    }

    @Test("T4: a second head mid-exchange is a broken pipeline: the connection closes")
    func t4() {
        var waiting = Machine(timeouts: Self.timeouts, now: Self.start)
        _ = waiting.requestHead(now: Self.start) { Self.exchange() }
        var made = false
        guard
            case .close = waiting.requestHead(
                now: Self.start,
                makeExchange: {
                    made = true
                    return Self.exchange()
                }
            )
        else {
            Issue.record("awaiting backend")
            return
        }
        var forwarding = Self.forwarding()
        guard
            case .close = forwarding.requestHead(
                now: Self.start,
                makeExchange: {
                    made = true
                    return Self.exchange()
                }
            )
        else {
            Issue.record("forwarding")
            return
        }
        #expect(!made)
    }

    // MARK: T5–T7: the lease

    @Test("T5: a leased connection starts forwarding, writes 100 Continue once, and passes on a held read")
    func t5() {
        var machine = Machine(timeouts: Self.timeouts, now: Self.start)
        let exchange = Self.exchange(.POST, body: true, expect: true)
        _ = machine.requestHead(now: Self.start) { exchange }
        let read1 = machine.read(backendWritable: true)
        #expect(!read1, "a read passed through with no backend connection")
        #expect(machine.readHeld)
        let backend = Backend()
        let action = machine.leased(exchange, .success(backend), reused: true, backendWritable: true, now: Self.start)
        guard case .startForwarding(let started, let on, writeContinue: true, resumeRead: true) = action,
            started === exchange, on === backend
        else {
            Issue.record("\(action)")
            return
        }
        #expect(!machine.readHeld)
        #expect(exchange.machine.attempt == .first(reused: true))
        #expect(exchange.machine.headerDeadline == Self.start + .seconds(300))
        guard case .forwarding(let current, let leased) = machine.state, current === exchange, leased === backend else {
            Issue.record("\(machine.state)")
            return
        }
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
        guard case .startForwarding(_, _, writeContinue: false, resumeRead: false) = action else {
            Issue.record("\(action)")
            return
        }
        #expect(machine.readHeld)
        let backendBecameWritable2 = machine.backendBecameWritable()
        #expect(backendBecameWritable2)
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
        guard case .respond(.backendBusy, let answered?, nil) = action, answered === exchange else {
            Issue.record("\(action)")
            return
        }
        guard case .closing = machine.state else {
            Issue.record("\(machine.state)")
            return
        }
    }

    @Test("T7: a connection leased for an exchange that is gone goes back to the pool unused")
    func t7() {
        var machine = Machine(timeouts: Self.timeouts, now: Self.start)
        let exchange = Self.exchange()
        _ = machine.requestHead(now: Self.start) { exchange }
        _ = machine.clientInactive()
        let backend = Backend()
        let action = machine.leased(exchange, .success(backend), reused: false, backendWritable: true, now: Self.start)
        guard case .returnUnused(let returned) = action, returned === backend else {
            Issue.record("\(action)")
            return
        }
        guard case .closed = machine.state else {
            Issue.record("\(machine.state)")
            return
        }
        // Another exchange's lease, while this one waits, is returned too.
        var waiting = Machine(timeouts: Self.timeouts, now: Self.start)
        _ = waiting.requestHead(now: Self.start) { Self.exchange() }
        guard
            case .returnUnused = waiting.leased(
                Self.exchange(),
                .success(backend),
                reused: false,
                backendWritable: true,
                now: Self.start
            )
        else {
            Issue.record("a stranger's lease was taken")
            return
        }
        guard case .awaitingBackend = waiting.state else {
            Issue.record("\(waiting.state)")
            return
        }
        guard
            case .none = waiting.leased(
                Self.exchange(),
                .failure(.backendBusy),
                reused: false,
                backendWritable: true,
                now: Self.start
            )
        else {
            Issue.record("a stranger's failed lease was answered")
            return
        }
    }

    // MARK: T8–T9: the response ends

    @Test("T8: the response's end finishes the exchange, recycles the backend and idles, passing on a held read")
    func t8() {
        let backend = Backend()
        let exchange = Self.exchange()
        var machine = Self.forwarding(exchange, backend: backend)
        guard case .writeHead(_, closeClient: false) = machine.responseHead(Self.head(.ok), now: Self.start) else {
            Issue.record("head")
            return
        }
        #expect(exchange.status == .ok)
        guard case .writeBody = machine.responseBody(bytes: 5, now: Self.start) else {
            Issue.record("body")
            return
        }
        #expect(exchange.bytesOut == 5)
        let read3 = machine.read(backendWritable: false)
        #expect(!read3)
        let end = Self.start + .seconds(2)
        let action = machine.responseEnd(now: end)
        guard
            case .finish(let finished, let released, reuseBackend: true, closeClient: false, resumeRead: true) = action,
            finished === exchange, released === backend
        else {
            Issue.record("\(action)")
            return
        }
        guard case .idle(let since) = machine.state else {
            Issue.record("\(machine.state)")
            return
        }
        #expect(since == end)
        #expect(!machine.readHeld)
        let backendReadComplete4 = machine.backendReadComplete()
        #expect(!backendReadComplete4, "a flush was still owed after the end's own flush")
    }

    @Test("T9: an end that closes the client (HTTP/1.0, Connection: close, a body left unread) moves to closing")
    func t9() {
        for exchange in [
            Self.exchange(version: .http1_0), Self.exchange(clientWantsClose: true), Self.exchange(.POST, body: true),
        ] {
            var machine = Self.forwarding(exchange)
            _ = machine.responseHead(Self.head(.ok), now: Self.start)
            _ = machine.read(backendWritable: false)
            let action = machine.responseEnd(now: Self.start)
            guard case .finish(_, _, let reuse, closeClient: true, resumeRead: false) = action else {
                Issue.record("\(action)")
                continue
            }
            #expect(reuse == (exchange.forwarded?.hasBody == false))
            guard case .closing = machine.state else {
                Issue.record("\(machine.state)")
                continue
            }
        }
    }

    // MARK: T10–T12: the backend connection closes

    @Test("T10: a reused connection closing before the head sends the request again; the second close is a 502")
    func t10() {
        let exchange = Self.exchange()
        var machine = Self.forwarding(exchange, reused: true)
        guard case .retry(let retried) = machine.backendClosed(invalidResponse: false, now: Self.start),
            retried === exchange
        else {
            Issue.record("no retry")
            return
        }
        guard case .awaitingBackend(let current) = machine.state, current === exchange else {
            Issue.record("\(machine.state)")
            return
        }
        _ = machine.leased(exchange, .success(Backend()), reused: true, backendWritable: true, now: Self.start)
        guard case .respond(.backendReset, _, nil) = machine.backendClosed(invalidResponse: false, now: Self.start)
        else {
            Issue.record("retried twice")
            return
        }
    }

    @Test("T11: a backend that dies mid-response is a cut, never a clean end")
    func t11() {
        var machine = Self.forwarding()
        _ = machine.responseHead(Self.head(.ok), now: Self.start)
        let action = machine.backendClosed(invalidResponse: false, now: Self.start)
        guard case .cut(_, outcome: "backend_closed_mid_response", release: nil) = action else {
            Issue.record("\(action)")
            return
        }
        guard case .closing = machine.state else {
            Issue.record("\(machine.state)")
            return
        }
    }

    @Test("T12: a close or garbage before the head is answered 502, not retried on a fresh connection")
    func t12() {
        var reset = Self.forwarding(reused: false)
        guard case .respond(.backendReset, _, nil) = reset.backendClosed(invalidResponse: false, now: Self.start)
        else {
            Issue.record("reset")
            return
        }
        var invalid = Self.forwarding(reused: true)
        guard
            case .respond(.backendInvalidResponse, _, nil) = invalid.backendClosed(
                invalidResponse: true,
                now: Self.start
            )
        else {
            Issue.record("invalid")
            return
        }
        guard case .closing = invalid.state else {
            Issue.record("\(invalid.state)")
            return
        }
    }

    // MARK: T13–T14: deadlines of an exchange

    @Test("T13: no response head by the header deadline is a 504, and the backend connection is closed")
    func t13() {
        let backend = Backend()
        var machine = Self.forwarding(backend: backend)
        #expect(machine.nextDeadline == Self.start + .seconds(300))
        guard case .none = machine.timerFired(now: Self.start + .seconds(299), backendWritable: true) else {
            Issue.record("timed out early")
            return
        }
        let action = machine.timerFired(now: Self.start + .seconds(300), backendWritable: true)
        guard case .respond(.backendTimeout, _, let released?) = action, released === backend else {
            Issue.record("\(action)")
            return
        }
        guard case .closing = machine.state else {
            Issue.record("\(machine.state)")
            return
        }
    }

    @Test("T14: a request body that stops arriving is a 408, unless backpressure holds it or no backend is ready")
    func t14() {
        let backend = Backend()
        let exchange = Self.exchange(.POST, body: true)
        var machine = Self.forwarding(exchange, backend: backend)
        _ = machine.requestBody(bytes: 10, now: Self.start + .seconds(10))
        #expect(exchange.bytesIn == 10)
        #expect(machine.nextDeadline == Self.start + .seconds(70))
        // Held by the backend: the deadline moves instead.
        guard case .none = machine.timerFired(now: Self.start + .seconds(70), backendWritable: false) else {
            Issue.record("cut while the backend held the body")
            return
        }
        #expect(machine.bodyProgress == Self.start + .seconds(70))
        let action = machine.timerFired(now: Self.start + .seconds(130), backendWritable: true)
        guard case .respond(.requestBodyTimeout, _, let released?) = action, released === backend else {
            Issue.record("\(action)")
            return
        }
        // While no backend connection is ready, reads are held: the silence is the gateway's.
        var waiting = Machine(timeouts: Self.timeouts, now: Self.start)
        _ = waiting.requestHead(now: Self.start) { Self.exchange(.POST, body: true) }
        guard case .none = waiting.timerFired(now: Self.start + .seconds(100), backendWritable: false) else {
            Issue.record("cut while waiting for a backend")
            return
        }
        #expect(waiting.nextDeadline == Self.start + .seconds(160))
    }

    // MARK: T15–T17: protocol switches

    @Test("T15: a 101 to a request that did not ask to switch is a 502, and the backend connection is closed")
    func t15() {
        let backend = Backend()
        var machine = Self.forwarding(backend: backend)
        let action = machine.responseHead(Self.head(.switchingProtocols), now: Self.start)
        guard case .respond(.backendInvalidResponse, _, let released?) = action, released === backend else {
            Issue.record("\(action)")
            return
        }
    }

    @Test("T16: an upgrade's 101 is held until its end, then both connections switch")
    func t16() {
        let backend = Backend()
        let exchange = Self.exchange(upgrade: true)
        var machine = Self.forwarding(exchange, backend: backend)
        guard case .none = machine.responseHead(Self.head(.switchingProtocols), now: Self.start) else {
            Issue.record("the 101 went out before its end")
            return
        }
        let action = machine.responseEnd(now: Self.start)
        guard case .upgrade(let upgraded, let on, let head) = action, upgraded === exchange, on === backend else {
            Issue.record("\(action)")
            return
        }
        #expect(head.status == .switchingProtocols)
        #expect(exchange.status == .switchingProtocols)
        guard case .upgrading = machine.state else {
            Issue.record("\(machine.state)")
            return
        }
        #expect(machine.nextDeadline == nil)
    }

    @Test("T17: a client gone during the switch leaves nothing to release; the switch then finds the state closed")
    func t17() {
        var machine = Self.forwarding(Self.exchange(upgrade: true))
        _ = machine.responseHead(Self.head(.switchingProtocols), now: Self.start)
        _ = machine.responseEnd(now: Self.start)
        guard case .none = machine.clientInactive() else {
            Issue.record("released during the switch")
            return
        }
        guard case .closed = machine.state else {
            Issue.record("\(machine.state)")
            return
        }
    }

    // MARK: T18–T20

    @Test("T18: the client going away closes the backend request and logs it client_closed")
    func t18() {
        let backend = Backend()
        var machine = Self.forwarding(backend: backend)
        guard case .abandon(_, let released?) = machine.clientInactive(), released === backend else {
            Issue.record("forwarding")
            return
        }
        guard case .closed = machine.state else {
            Issue.record("\(machine.state)")
            return
        }
        var waiting = Machine(timeouts: Self.timeouts, now: Self.start)
        _ = waiting.requestHead(now: Self.start) { Self.exchange() }
        guard case .abandon(_, nil) = waiting.clientInactive() else {
            Issue.record("waiting")
            return
        }
        var idle = Machine(timeouts: Self.timeouts, now: Self.start)
        guard case .none = idle.clientInactive() else {
            Issue.record("idle")
            return
        }
        #expect(idle.nextDeadline == nil)
    }

    @Test("T19: the client's bytes failing to parse are a 400 or 431 until the response started, then a close")
    func t19() {
        var idle = Machine(timeouts: Self.timeouts, now: Self.start)
        guard case .respond(.headersTooLarge, nil, nil) = idle.requestParseFailed(.headersTooLarge, now: Self.start)
        else {
            Issue.record("idle")
            return
        }
        let backend = Backend()
        var forwarding = Self.forwarding(Self.exchange(.POST, body: true), backend: backend)
        guard
            case .respond(.malformedRequest, _?, let released?) = forwarding.requestParseFailed(
                .malformedRequest,
                now: Self.start
            ),
            released === backend
        else {
            Issue.record("forwarding")
            return
        }
        var streaming = Self.forwarding(Self.exchange(.POST, body: true))
        _ = streaming.responseHead(Self.head(.ok), now: Self.start)
        guard case .close = streaming.requestParseFailed(.malformedRequest, now: Self.start) else {
            Issue.record("streaming")
            return
        }
        var closing = Machine(timeouts: Self.timeouts, now: Self.start)
        _ = closing.requestParseFailed(.malformedRequest, now: Self.start)
        guard case .none = closing.requestParseFailed(.malformedRequest, now: Self.start) else {
            Issue.record("closing: later garbage cut the answer short")
            return
        }
    }

    @Test("T20: the gateway ending an exchange whose head was sent cuts it, with the error as its outcome")
    func t20() {
        let backend = Backend()
        var machine = Self.forwarding(backend: backend)
        _ = machine.responseHead(Self.head(.ok), now: Self.start)
        let action = machine.responseHead(Self.head(.ok), now: Self.start)
        guard case .cut(_, outcome: "backend_invalid_response", let released?) = action, released === backend else {
            Issue.record("\(action)")
            return
        }
        guard case .closing = machine.state else {
            Issue.record("\(machine.state)")
            return
        }
    }

    // MARK: The connection's own deadlines and flow control

    @Test("an idle connection closes at the idle deadline, a closing one at the closing deadline")
    func idleAndClosing() {
        var idle = Machine(timeouts: Self.timeouts, now: Self.start)
        #expect(idle.nextDeadline == Self.start + .seconds(60))
        guard case .none = idle.timerFired(now: Self.start + .seconds(59), backendWritable: false) else {
            Issue.record("closed early")
            return
        }
        guard case .close = idle.timerFired(now: Self.start + .seconds(60), backendWritable: false) else {
            Issue.record("idle")
            return
        }
        var closing = Machine(timeouts: Self.timeouts, now: Self.start)
        _ = closing.requestParseFailed(.malformedRequest, now: Self.start)
        #expect(closing.nextDeadline == Self.start + .seconds(30))
        guard case .close = closing.timerFired(now: Self.start + .seconds(30), backendWritable: false) else {
            Issue.record("closing")
            return
        }
    }

    @Test("a client that takes nothing for the stall timeout is closed; taking again clears it")
    func stall() {
        let backend = Backend()
        var machine = Self.forwarding(backend: backend)
        _ = machine.responseHead(Self.head(.ok), now: Self.start)
        #expect(machine.nextDeadline == nil)
        guard
            case .setBackendReads(let held, allowed: false) = machine.clientWritabilityChanged(
                isWritable: false,
                now: Self.start
            ),
            held === backend
        else {
            Issue.record("backend reads not held")
            return
        }
        _ = machine.clientWritabilityChanged(isWritable: false, now: Self.start + .seconds(100))
        #expect(machine.nextDeadline == Self.start + .seconds(600))
        guard case .close = machine.timerFired(now: Self.start + .seconds(600), backendWritable: true) else {
            Issue.record("stalled client kept")
            return
        }
        guard
            case .setBackendReads(_, allowed: true) = machine.clientWritabilityChanged(
                isWritable: true,
                now: Self.start
            )
        else {
            Issue.record("backend reads not resumed")
            return
        }
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
        guard case .none = machine.readComplete() else {
            Issue.record("flushed with nothing written")
            return
        }
        guard case .forward(let to) = machine.requestBody(bytes: 1, now: Self.start), to === backend else {
            Issue.record("body not forwarded")
            return
        }
        guard case .forward = machine.requestEnd() else {
            Issue.record("end not forwarded")
            return
        }
        guard case .flushBackend(let flushed) = machine.readComplete(), flushed === backend else {
            Issue.record("no flush")
            return
        }
        guard case .none = machine.readComplete() else {
            Issue.record("flushed twice")
            return
        }
        let backendReadComplete5 = machine.backendReadComplete()
        #expect(!backendReadComplete5)
        _ = machine.responseHead(Self.head(.ok), now: Self.start)
        let backendReadComplete6 = machine.backendReadComplete()
        #expect(backendReadComplete6)
        let backendReadComplete7 = machine.backendReadComplete()
        #expect(!backendReadComplete7)
    }

    @Test("parts that arrive before a backend connection are buffered; reads pass only with somewhere to go")
    func buffering() {
        var machine = Machine(timeouts: Self.timeouts, now: Self.start)
        let read8 = machine.read(backendWritable: false)
        #expect(read8)
        let exchange = Self.exchange(.POST, body: true)
        _ = machine.requestHead(now: Self.start) { exchange }
        guard case .buffer(let into) = machine.requestBody(bytes: 7, now: Self.start), into === exchange else {
            Issue.record("body")
            return
        }
        guard case .buffer = machine.requestEnd() else {
            Issue.record("end")
            return
        }
        #expect(exchange.bytesIn == 7)
        #expect(exchange.machine.request == .complete)
        let read9 = machine.read(backendWritable: true)
        #expect(!read9)
        let backendBecameWritable10 = machine.backendBecameWritable()
        #expect(!backendBecameWritable10, "a read went through with no backend connection")
    }
}
