import NIOCore
import NIOHTTP1
import Testing

@testable import ILSProxy

/// One request and its response, driven through `ExchangeMachine` alone: each transition, and what it must refuse.
@Suite("ExchangeMachine: one exchange's lifecycle")
struct ExchangeMachineTests {
    static let deadline = NIODeadline.uptimeNanoseconds(1_000_000_000)

    static func machine(
        _ method: HTTPMethod = .GET,
        version: HTTPVersion = .http1_1,
        body: Bool = false,
        upgrade: Bool = false,
        clientWantsClose: Bool = false,
        expectsContinue: Bool = false
    ) -> ExchangeMachine {
        ExchangeMachine(
            method: method,
            version: version,
            forwarded: ForwardedRequest(
                head: HTTPRequestHead(version: version, method: method, uri: "/"),
                isUpgrade: upgrade,
                hasBody: body,
                clientWantsClose: clientWantsClose
            ),
            expectsContinue: expectsContinue
        )
    }

    static func head(_ status: HTTPResponseStatus, keepAlive: Bool = true) -> HTTPResponseHead {
        var head = HTTPResponseHead(version: .http1_1, status: status)
        if !keepAlive { head.headers.add(name: "Connection", value: "close") }
        return head
    }

    @Test("a new exchange keeps the client connection unless the client closes, upgrades or was refused")
    func clientPersistence() {
        #expect(Self.machine().client == .keepAlive)
        #expect(Self.machine(clientWantsClose: true).client == .close)
        #expect(Self.machine(upgrade: true).client == .close)
        let refused = ExchangeMachine(method: .GET, version: .http1_1, forwarded: nil, expectsContinue: false)
        #expect(refused.client == .close)
        #expect(!refused.isReplayable)
        #expect(refused.response == .awaitingHead(deadline: nil))
        #expect(refused.request == .receiving)
    }

    @Test("only an idempotent request without a body or an upgrade may be sent twice")
    func replayable() {
        for method: HTTPMethod in [.GET, .HEAD, .OPTIONS, .PUT, .DELETE] { #expect(Self.machine(method).isReplayable) }
        #expect(!Self.machine(.POST).isReplayable)
        #expect(!Self.machine(.PATCH).isReplayable)
        #expect(!Self.machine(.PUT, body: true).isReplayable)
        #expect(!Self.machine(upgrade: true).isReplayable)
    }

    @Test("a backend connection sets the header deadline and counts the attempt; 100 Continue is owed once")
    func assigned() {
        var machine = Self.machine(.POST, body: true, expectsContinue: true)
        #expect(machine.expectation == .owed)
        #expect(machine.headerDeadline == nil)
        let backendAssigned1 = machine.backendAssigned(reused: true, headerDeadline: Self.deadline)
        #expect(backendAssigned1)
        #expect(machine.expectation == .sent)
        #expect(machine.attempt == .first(reused: true))
        #expect(machine.headerDeadline == Self.deadline)
        let backendAssigned2 = machine.backendAssigned(reused: false, headerDeadline: Self.deadline + .seconds(1))
        #expect(!backendAssigned2)
        #expect(machine.attempt == .retried)
        #expect(machine.headerDeadline == Self.deadline + .seconds(1))
        var plain = Self.machine()
        let backendAssigned3 = plain.backendAssigned(reused: false, headerDeadline: Self.deadline)
        #expect(!backendAssigned3)
        #expect(plain.attempt == .first(reused: false))
    }

    @Test("the request's end ends the body deadline; a response head ends it too")
    func requestBodyDeadline() {
        var machine = Self.machine(.POST, body: true)
        #expect(machine.awaitsRequestBody)
        machine.requestEnded()
        #expect(machine.request == .complete)
        #expect(!machine.awaitsRequestBody)
        var answered = Self.machine(.POST, body: true)
        _ = answered.backendAssigned(reused: false, headerDeadline: Self.deadline)
        _ = answered.responseHead(Self.head(.ok))
        #expect(!answered.awaitsRequestBody)
        #expect(answered.headerDeadline == nil)
    }

    @Test("a response head is forwarded; HTTP/1.0 closes the client, Connection: close the backend")
    func responseHead() {
        var machine = Self.machine()
        _ = machine.backendAssigned(reused: false, headerDeadline: Self.deadline)
        let responseHead4 = machine.responseHead(Self.head(.ok))
        #expect(responseHead4 == .forward(closeClient: false))
        #expect(machine.response == .streaming)
        #expect(machine.responseHeadSent)
        #expect(machine.backend == .keepAlive)
        var old = Self.machine(version: .http1_0)
        let responseHead5 = old.responseHead(Self.head(.ok))
        #expect(responseHead5 == .forward(closeClient: true))
        var closing = Self.machine()
        _ = closing.responseHead(Self.head(.ok, keepAlive: false))
        #expect(closing.backend == .close)
        closing.requestEnded()
        let closingEnd = closing.responseEnded()
        #expect(closingEnd == .finish(reuseBackend: false, closeClient: false))
    }

    @Test("a 101 to an upgrade is held until its end; a 101 nobody asked for, or a second head, is refused")
    func switching() {
        var upgrade = Self.machine(upgrade: true)
        let switched = Self.head(.switchingProtocols)
        let responseHead7 = upgrade.responseHead(switched)
        #expect(responseHead7 == .holdSwitch)
        #expect(upgrade.response == .switching(switched))
        #expect(!upgrade.responseHeadSent)
        let responseEnded8 = upgrade.responseEnded()
        #expect(responseEnded8 == .upgrade(switched))
        #expect(upgrade.response == .streaming)

        var unsolicited = Self.machine()
        let responseHead9 = unsolicited.responseHead(switched)
        #expect(responseHead9 == .refuse(.backendInvalidResponse))
        #expect(unsolicited.backend == .close)
        #expect(!unsolicited.responseHeadSent)

        var twice = Self.machine()
        _ = twice.responseHead(Self.head(.ok))
        let responseHead10 = twice.responseHead(Self.head(.ok))
        #expect(responseHead10 == .refuse(.backendInvalidResponse))
        #expect(twice.backend == .close)
    }

    @Test("the response's end recycles the backend unless the request is unfinished, it closes, or it upgraded")
    func finish() {
        var machine = Self.machine()
        machine.requestEnded()
        _ = machine.responseHead(Self.head(.ok))
        let responseEnded11 = machine.responseEnded()
        #expect(responseEnded11 == .finish(reuseBackend: true, closeClient: false))
        #expect(machine.response == .complete)

        var early = Self.machine(.POST, body: true)
        _ = early.responseHead(Self.head(.payloadTooLarge))
        let responseEnded12 = early.responseEnded()
        #expect(responseEnded12 == .finish(reuseBackend: false, closeClient: true))
        #expect(early.backend == .close)
        #expect(early.client == .close)

        var refusedUpgrade = Self.machine(upgrade: true)
        refusedUpgrade.requestEnded()
        let responseHead13 = refusedUpgrade.responseHead(Self.head(.forbidden))
        #expect(responseHead13 == .forward(closeClient: true))
        let responseEnded14 = refusedUpgrade.responseEnded()
        #expect(responseEnded14 == .finish(reuseBackend: false, closeClient: true))
    }

    @Test("a reused connection that closes before answering a replayable request is retried once, never twice")
    func retry() {
        var machine = Self.machine()
        _ = machine.backendAssigned(reused: true, headerDeadline: Self.deadline)
        #expect(machine.isRetryable)
        let backendClosed15 = machine.backendClosed(invalidResponse: false)
        #expect(backendClosed15 == .retry)
        #expect(machine.response == .awaitingHead(deadline: nil))
        _ = machine.backendAssigned(reused: true, headerDeadline: Self.deadline)
        #expect(!machine.isRetryable)
        let backendClosed16 = machine.backendClosed(invalidResponse: false)
        #expect(backendClosed16 == .refuse(.backendReset))
    }

    @Test("a close before the head is a reset, or an invalid response; after the head it is a cut")
    func backendClosed() {
        var fresh = Self.machine()
        _ = fresh.backendAssigned(reused: false, headerDeadline: Self.deadline)
        let backendClosed17 = fresh.backendClosed(invalidResponse: false)
        #expect(backendClosed17 == .refuse(.backendReset))
        var garbled = Self.machine()
        _ = garbled.backendAssigned(reused: true, headerDeadline: Self.deadline)
        let backendClosed18 = garbled.backendClosed(invalidResponse: true)
        #expect(backendClosed18 == .refuse(.backendInvalidResponse))
        var withBody = Self.machine(.PUT, body: true)
        _ = withBody.backendAssigned(reused: true, headerDeadline: Self.deadline)
        let backendClosed19 = withBody.backendClosed(invalidResponse: false)
        #expect(backendClosed19 == .refuse(.backendReset))
        var streaming = Self.machine()
        _ = streaming.backendAssigned(reused: true, headerDeadline: Self.deadline)
        _ = streaming.responseHead(Self.head(.ok))
        #expect(!streaming.isRetryable)
        let backendClosed20 = streaming.backendClosed(invalidResponse: false)
        #expect(backendClosed20 == .cut)
    }

    @Test("an end with no head before it, or a second end, is an invalid response and the backend is not reused")
    func endWithoutHead() {
        var headless = Self.machine()
        let headlessEnd = headless.responseEnded()
        #expect(headlessEnd == .refuse(.backendInvalidResponse))
        #expect(headless.backend == .close)
        var twice = Self.machine()
        twice.requestEnded()
        _ = twice.responseHead(Self.head(.ok))
        _ = twice.responseEnded()
        let secondEnd = twice.responseEnded()
        #expect(secondEnd == .refuse(.backendInvalidResponse))
    }
}
