import ILSCore
import NIOCore
import NIOHTTP1
import Testing

@testable import ILSProxy

/// Every event in every state of `ProxyConnectionMachine`, against a table written out by hand: removing or changing
/// any arm of the machine changes a cell. A cell reads `action → next state`.
@Suite("ProxyConnectionMachine: every event in every state")
struct ProxyConnectionMachineTableTests {
    typealias Fixture = ProxyConnectionMachineTests
    typealias Machine = Fixture.Machine

    enum StateKind: String, CaseIterable {
        case idle, awaitingBackend, awaitingHead, streaming, closing, upgrading, closed
    }

    enum EventKind: String, CaseIterable {
        case head, body, end, readComplete, read, unwritable, inactive, parseError, leased, leaseFailed
        case responseHead, responseBody, responseEnd, backendClosed, timer, inputClosed
    }

    /// A machine in `kind`, reached through events only, with its exchange. The request is a POST whose body is still
    /// arriving, so every request event means something; the upgrade is a GET.
    static func machine(in kind: StateKind) -> (Machine, Exchange?) {
        let start = Fixture.start
        var machine = Machine(timeouts: Fixture.timeouts, now: start)
        let post = Fixture.exchange(.POST, body: true)
        switch kind {
        case .idle:
            return (machine, nil)
        case .awaitingBackend:
            _ = machine.requestHead(now: start) { post }
            return (machine, post)
        case .awaitingHead, .streaming:
            _ = machine.requestHead(now: start) { post }
            _ = machine.leased(post, .success(Fixture.Backend()), reused: false, backendWritable: true, now: start)
            if kind == .streaming { _ = machine.responseHead(Fixture.head(.ok), now: start) }
            return (machine, post)
        case .closing:
            _ = machine.requestParseFailed(.malformedRequest, now: start)
            return (machine, nil)
        case .upgrading:
            let upgrade = Fixture.exchange(upgrade: true)
            _ = machine.requestHead(now: start) { upgrade }
            _ = machine.requestEnd()
            _ = machine.leased(upgrade, .success(Fixture.Backend()), reused: false, backendWritable: true, now: start)
            _ = machine.responseHead(Fixture.head(.switchingProtocols), now: start)
            _ = machine.responseEnd(now: start)
            return (machine, upgrade)
        case .closed:
            _ = machine.clientInactive()
            return (machine, nil)
        }
    }

    /// Applies `event` and names what came out.
    static func apply(_ event: EventKind, to machine: inout Machine, exchange: Exchange?) -> String {
        let later = Fixture.start + .seconds(1000)
        switch event {
        case .head: return name(machine.requestHead(now: later) { Fixture.exchange() })
        case .body: return name(machine.requestBody(bytes: 1, now: later))
        case .end: return name(machine.requestEnd())
        case .readComplete:
            _ = machine.requestBody(bytes: 1, now: later)
            return name(machine.readComplete())
        case .read: return machine.read(backendWritable: true) ? "read" : "hold"
        case .unwritable: return name(machine.clientWritabilityChanged(isWritable: false, now: later))
        case .inactive: return name(machine.clientInactive())
        case .parseError: return name(machine.requestParseFailed(.malformedRequest, now: later))
        case .leased:
            let action = machine.leased(
                exchange ?? Fixture.exchange(),
                .success(Fixture.Backend()),
                reused: false,
                backendWritable: true,
                now: later
            )
            return name(action)
        case .leaseFailed:
            let action = machine.leased(
                exchange ?? Fixture.exchange(),
                .failure(.backendBusy),
                reused: false,
                backendWritable: true,
                now: later
            )
            return name(action)
        case .responseHead: return name(machine.responseHead(Fixture.head(.ok), now: later))
        case .responseBody: return name(machine.responseBody(bytes: 1, now: later))
        case .responseEnd: return name(machine.responseEnd(now: later))
        case .backendClosed: return name(machine.backendClosed(invalidResponse: false, now: later))
        case .timer: return name(machine.timerFired(now: later, backendWritable: true))
        case .inputClosed: return name(machine.clientInputClosed(now: later))
        }
    }

    static func name(_ action: Machine.Action) -> String {
        switch action {
        case .none: "none"
        case .close: "close"
        case .stalled(let exchange, let backend):
            "stalled(\(exchange == nil ? "-" : "exchange")\(backend == nil ? "" : ", release"))"
        case .lease: "lease"
        case .respond(let error, _, let backend): "respond(\(error.code)\(backend == nil ? "" : ", release"))"
        case .cut(_, let outcome, let backend): "cut(\(outcome)\(backend == nil ? "" : ", release"))"
        case .flushBackend: "flushBackend"
        case .returnUnused: "returnUnused"
        case .retry: "retry"
        case .abandon(_, let backend): "abandon\(backend == nil ? "" : "(release)")"
        case .setBackendReads(_, let allowed): "setBackendReads(\(allowed))"
        }
    }

    static func name(_ part: Machine.RequestPart) -> String {
        switch part {
        case .none: "none"
        case .buffer: "buffer"
        case .forward: "forward"
        }
    }

    static func name(_ lease: Machine.Lease) -> String {
        switch lease {
        case .startForwarding(_, _, let writeContinue, let resumeRead):
            "startForwarding(\(writeContinue ? "continue" : "-"), \(resumeRead ? "resume" : "-"))"
        case .other(let action): name(action)
        }
    }

    static func name(_ head: Machine.ResponseHead) -> String {
        switch head {
        case .writeHead(_, let closeClient): "writeHead(\(closeClient ? "close" : "keep"))"
        case .other(let action): name(action)
        }
    }

    static func name(_ body: Machine.ResponseBody) -> String {
        switch body {
        case .writeBody: "writeBody"
        case .other(let action): name(action)
        }
    }

    static func name(_ end: Machine.ResponseEnd) -> String {
        switch end {
        case .finish(_, _, let reuse, let close, let resume):
            "finish(\(reuse ? "reuse" : "drop"), \(close ? "close" : "keep"), \(resume ? "resume" : "-"))"
        case .upgrade: "upgrade"
        case .other(let action): name(action)
        }
    }

    static func name(_ state: Machine.State) -> String {
        switch state {
        case .idle: "idle"
        case .awaitingBackend: "awaitingBackend"
        case .forwarding(let current, _):
            current.machine.responseHeadSent ? "streaming" : "awaitingHead"
        case .closing: "closing"
        case .upgrading: "upgrading"
        case .closed: "closed"
        }
    }

    /// Rows: the state the machine was in. Cells, in `EventKind` order: the action, then the state after.
    static let expected: [StateKind: [String]] = [
        .idle: [
            "lease → awaitingBackend",  // head
            "none → idle",  // body
            "none → idle",  // end
            "none → idle",  // readComplete
            "read → idle",  // read
            "none → idle",  // unwritable
            "none → closed",  // inactive
            "respond(malformed_request) → closing",  // parseError
            "returnUnused → idle",  // leased
            "none → idle",  // leaseFailed
            "none → idle",  // responseHead
            "none → idle",  // responseBody
            "none → idle",  // responseEnd
            "none → idle",  // backendClosed
            "close → idle",  // timer
            "close → closing",  // inputClosed
        ],
        .awaitingBackend: [
            "close → awaitingBackend",  // head
            "buffer → awaitingBackend",  // body
            "buffer → awaitingBackend",  // end
            "none → awaitingBackend",  // readComplete
            "hold → awaitingBackend",  // read
            "none → awaitingBackend",  // unwritable
            "abandon → closed",  // inactive
            "respond(malformed_request) → closing",  // parseError
            "startForwarding(-, -) → awaitingHead",  // leased
            "respond(backend_busy) → closing",  // leaseFailed
            "none → awaitingBackend",  // responseHead
            "none → awaitingBackend",  // responseBody
            "none → awaitingBackend",  // responseEnd
            "none → awaitingBackend",  // backendClosed
            "none → awaitingBackend",  // timer
            "none → awaitingBackend",  // inputClosed
        ],
        .awaitingHead: [
            "close → awaitingHead",  // head
            "forward → awaitingHead",  // body
            "forward → awaitingHead",  // end
            "flushBackend → awaitingHead",  // readComplete
            "read → awaitingHead",  // read
            "setBackendReads(false) → awaitingHead",  // unwritable
            "abandon(release) → closed",  // inactive
            "respond(malformed_request, release) → closing",  // parseError
            "returnUnused → awaitingHead",  // leased
            "none → awaitingHead",  // leaseFailed
            "writeHead(keep) → streaming",  // responseHead
            "respond(backend_invalid_response, release) → closing",  // responseBody
            "respond(backend_invalid_response, release) → closing",  // responseEnd
            "respond(backend_reset) → closing",  // backendClosed
            "respond(backend_timeout, release) → closing",  // timer
            "none → awaitingHead",  // inputClosed
        ],
        .streaming: [
            "close → streaming",  // head
            "forward → streaming",  // body
            "forward → streaming",  // end
            "flushBackend → streaming",  // readComplete
            "read → streaming",  // read
            "setBackendReads(false) → streaming",  // unwritable
            "abandon(release) → closed",  // inactive
            "close → streaming",  // parseError
            "returnUnused → streaming",  // leased
            "none → streaming",  // leaseFailed
            "cut(backend_invalid_response, release) → closing",  // responseHead
            "writeBody → streaming",  // responseBody
            "finish(drop, close, -) → closing",  // responseEnd
            "cut(backend_closed_mid_response) → closing",  // backendClosed
            "none → streaming",  // timer
            "none → streaming",  // inputClosed
        ],
        .closing: [
            "none → closing",  // head
            "none → closing",  // body
            "none → closing",  // end
            "none → closing",  // readComplete
            "read → closing",  // read
            "none → closing",  // unwritable
            "none → closed",  // inactive
            "none → closing",  // parseError
            "returnUnused → closing",  // leased
            "none → closing",  // leaseFailed
            "none → closing",  // responseHead
            "none → closing",  // responseBody
            "none → closing",  // responseEnd
            "none → closing",  // backendClosed
            "close → closing",  // timer
            "none → closing",  // inputClosed
        ],
        .upgrading: [
            "close → upgrading",  // head
            "none → upgrading",  // body
            "none → upgrading",  // end
            "none → upgrading",  // readComplete
            "read → upgrading",  // read
            "none → upgrading",  // unwritable
            "none → closed",  // inactive
            "close → upgrading",  // parseError
            "returnUnused → upgrading",  // leased
            "none → upgrading",  // leaseFailed
            "none → upgrading",  // responseHead
            "none → upgrading",  // responseBody
            "none → upgrading",  // responseEnd
            "none → upgrading",  // backendClosed
            "none → upgrading",  // timer
            "none → upgrading",  // inputClosed
        ],
        .closed: [
            "close → closed",  // head
            "none → closed",  // body
            "none → closed",  // end
            "none → closed",  // readComplete
            "read → closed",  // read
            "none → closed",  // unwritable
            "none → closed",  // inactive
            "close → closed",  // parseError
            "returnUnused → closed",  // leased
            "none → closed",  // leaseFailed
            "none → closed",  // responseHead
            "none → closed",  // responseBody
            "none → closed",  // responseEnd
            "none → closed",  // backendClosed
            "none → closed",  // timer
            "none → closed",  // inputClosed
        ],
    ]

    @Test("each event in each state gives the action and the next state the table says")
    func table() {
        for state in StateKind.allCases {
            let row = Self.expected[state] ?? []
            #expect(row.count == EventKind.allCases.count, "row \(state) has \(row.count) cells")
            for (event, cell) in zip(EventKind.allCases, row) {
                var (machine, exchange) = Self.machine(in: state)
                let action = Self.apply(event, to: &machine, exchange: exchange)
                let actual = "\(action) → \(Self.name(machine.state))"
                #expect(actual == cell, "\(event) in \(state)")
            }
        }
    }

    @Test("the table names every state once")
    func everyState() {
        #expect(Set(Self.expected.keys) == Set(StateKind.allCases))
    }
}
