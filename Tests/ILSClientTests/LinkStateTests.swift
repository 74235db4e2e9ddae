import Foundation
import ILSCore
import ILSFabric
import ILSTesting
import NIOConcurrencyHelpers
import Testing

@testable import ILSClient
@testable import ILSDial

#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// Issue 39, a link state the UI can trust: the machine alone, event by event.
@Suite("The link state, event by event")
struct LinkStateMachineTests {
    @Test("a request's life: idle, connecting, ready, then idle again after the idle close")
    func requestLife() {
        var machine = LinkStateMachine()
        #expect(machine.state == .idle)
        #expect(machine.connecting() == .connecting)
        #expect(machine.connected() == .ready)
        #expect(machine.connectionClosed() == .idle)
    }

    @Test("a silent link with a circuit waiting is stalled until anything arrives")
    func stalled() {
        var machine = LinkStateMachine()
        _ = machine.connecting()
        _ = machine.connected()
        #expect(machine.keepalive(silent: true) == .stalled)
        #expect(machine.keepalive(silent: false) == .ready)
    }

    @Test("held circuits are resuming across the lost connection and the new one, then ready")
    func resuming() {
        var machine = LinkStateMachine()
        _ = machine.connecting()
        _ = machine.connected()
        #expect(machine.keepalive(silent: true) == .stalled)
        #expect(machine.circuitHeld() == .resuming)
        #expect(machine.connectionClosed() == nil)
        #expect(machine.connecting() == nil)
        #expect(machine.connectFailed(code: "controller_unreachable", reason: "no route") == nil)
        #expect(machine.connected() == nil)
        #expect(machine.circuitHeld() == nil)
        #expect(machine.circuitSettled() == nil)
        #expect(machine.circuitSettled() == .ready)
    }

    @Test("a refused identity is offline with its reason, and stays so when its connection closes")
    func offline() {
        var machine = LinkStateMachine()
        _ = machine.connecting()
        _ = machine.connected()
        let refused = LinkState.offline(code: "identity_blocked", reason: "identity 'tab' is revoked")
        #expect(machine.identityRefused(code: "identity_blocked", reason: "identity 'tab' is revoked") == refused)
        #expect(machine.connectionClosed() == nil)
        #expect(machine.state == refused)
        #expect(machine.connecting() == .connecting)
        #expect(machine.connectFailed(code: "controller_unreachable", reason: "down") != nil)
    }
}

/// The link state of a real dialer, through a controller, gateway and backend in process. (`stalled` over a
/// black-holed link: e2e `test_resumption.py`, the network switch, through `ils-client-example stream`'s stderr.)
@Suite("The link state of a real dialer", .clusterExclusive)
struct LinkStateTests {
    /// Every state a dialer's `linkStates` yields, in order.
    final class Seen: Sendable {
        let states = NIOLockedValueBox<[LinkState]>([])
        let task: Task<Void, Never>

        init(_ dialer: OverlayDialer) {
            let states = self.states
            let stream = dialer.linkStates
            task = Task { for await state in stream { states.withLockedValue { $0.append(state) } } }
        }

        var all: [LinkState] { states.withLockedValue { $0 } }
    }

    @Test("idle, connecting, ready for a request, and idle after the idle time")
    func idleAfterTheIdleTime() async throws {
        try await withClientCluster { cluster in
            let identity = try await cluster.enroll("tab", role: .device)
            let dialer = try OverlayDialer(
                identity: identity,
                idle: FabricKeepalive.Idle(closeAfter: .milliseconds(200))
            )
            let seen = Seen(dialer)
            defer { seen.task.cancel() }
            let response = try await OverlayClient(dialer: dialer).stream(
                URLRequest(url: URL(string: "http://claude-api/health")!)
            )
            for try await _ in response.body {}
            #expect(await TestCluster.eventually { seen.all == [.idle, .connecting, .ready, .idle] }, "\(seen.all)")
            #expect(dialer.linkState == .idle)
        }
    }

    @Test("offline with identity_blocked once the controller refuses the revoked identity")
    func offlineWhenRevoked() async throws {
        try await withClientCluster { cluster in
            let identity = try await cluster.enroll("tab", role: .device)
            let dialer = try OverlayDialer(identity: identity)
            let client = OverlayClient(dialer: dialer)
            let seen = Seen(dialer)
            defer { seen.task.cancel() }
            let first = try await client.stream(URLRequest(url: URL(string: "http://claude-api/health")!))
            for try await _ in first.body {}
            #expect(dialer.linkState == .ready)

            let _: IdentityRecord = try await cluster.admin().call(.POST, "/v1/admin/identities/tab/revoke")
            await #expect(throws: URLError.self) {
                _ = try await client.stream(URLRequest(url: URL(string: "http://claude-api/health")!))
            }
            let offline = {
                if case .offline(code: "identity_blocked", _) = dialer.linkState { true } else { false }
            }
            #expect(await TestCluster.eventually { offline() }, "\(seen.all)")
            // The stream's reader hears it a moment after the dialer's state changed: wait for that, not only the state.
            #expect(
                await TestCluster.eventually {
                    seen.all.contains { if case .offline(code: "identity_blocked", _) = $0 { true } else { false } }
                },
                "\(seen.all)"
            )
        }
    }

    @Test("networkChanged moves a streaming circuit to a new connection at once: every event arrives, resumed")
    func networkChangedResumesAtOnce() async throws {
        try await withClientCluster { cluster in
            let identity = try await cluster.enroll("tab", role: .device)
            // A keepalive that would take minutes to notice: only networkChanged can move the circuit in time.
            let dialer = try OverlayDialer(
                identity: identity,
                keepalive: FabricKeepalive(interval: .seconds(600), timeout: .seconds(600))
            )
            let client = OverlayClient(dialer: dialer)
            let seen = Seen(dialer)
            defer { seen.task.cancel() }
            let response = try await client.stream(
                URLRequest(url: URL(string: "http://claude-api/sse?n=20&interval_ms=50")!)
            )
            var received = ""
            var changed = false
            for try await chunk in response.body {
                received += String(decoding: chunk, as: UTF8.self)
                if !changed {
                    changed = true
                    client.networkChanged()
                }
            }
            #expect(sseData(received).count == 20, "\(received)")
            #expect(cluster.gateways[0].resumedCount >= 1)
            // The stream's reader may trail the dialer: wait until it has heard the resumption and the ready after it.
            let resumedThenReady = {
                let states = seen.all
                guard let resuming = states.firstIndex(of: .resuming) else { return false }
                return states[resuming...].contains(.ready)
            }
            #expect(await TestCluster.eventually { resumedThenReady() }, "\(seen.all)")
        }
    }
}
