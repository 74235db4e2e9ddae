import Foundation
import ILSCore
import ILSFabric
import ILSStore
import ILSTesting
import Logging
import NIOConcurrencyHelpers
import NIOCore
import NIOEmbedded
import NIOHTTP2
import Testing

@testable import ILSController

@Suite("A gateway's control stream at the controller")
struct HostControlTests {
    /// The gateway counts itself hosting once it has the controller's answer; a device dialling at that moment must
    /// find the gateway registered with the relay. With the answer written first, a dial could fall between the two
    /// and get 503 service_unavailable (seen as a rare test failure on a loaded machine).
    @Test("the relay has the gateway before the answer that tells it it is hosting is written")
    func registersBeforeAnswering() async throws {
        let (state, directory) = try await temporaryControllerState()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let gateway = gatewayRecord()
        let channel = EmbeddedChannel()
        // What had been written when `register` ran: the control stream's head, and no answer yet.
        let writtenAtRegistration = NIOLockedValueBox<[HTTP2Frame.FramePayload]?>(nil)
        let handler = HostControlHandler(gateway: gateway, controller: Controller(state: state), link: (0, 1)) { _ in
            var written: [HTTP2Frame.FramePayload] = []
            while let payload = try? channel.readOutbound(as: HTTP2Frame.FramePayload.self) {
                written.append(payload)
            }
            writtenAtRegistration.withLockedValue { $0 = written }
        }
        try channel.pipeline.syncOperations.addHandler(handler)
        try channel.writeInbound(
            HTTP2Frame.FramePayload.headers(
                .init(headers: [":status": "200", FabricProtocol.serviceHeader: "claude-api"])
            )
        )
        let before = try #require(writtenAtRegistration.withLockedValue { $0 }, "the gateway was never registered")
        #expect(before.count == 1)
        #expect(before.allSatisfy { if case .headers = $0 { true } else { false } })
        // The answer follows, with the dial policy and no error.
        guard case .data(let answer) = try channel.readOutbound(as: HTTP2Frame.FramePayload.self),
            case .byteBuffer(let body) = answer.data
        else {
            Issue.record("no answer after the registration")
            return
        }
        #expect(!answer.endStream)
        let text = String(buffer: body)
        #expect(text.contains("\"dialRoles\""))
        #expect(!text.contains("\"error\""))
        _ = try channel.finish()
    }
}

/// A controller state in a fresh temporary directory (the caller removes the directory), for tests that drive the
/// controller's parts without a server.
func temporaryControllerState() async throws -> (ControllerState, directory: String) {
    let directory = FileManager.default.temporaryDirectory.appendingPathComponent("ils-state-\(UUID().uuidString)")
        .path
    let state = try await ControllerState.initialize(
        directory: "\(directory)/state",
        address: try ControllerAddress(parsing: "https://127.0.0.1:1"),
        adminOut: "\(directory)/admin.json"
    )
    return (state, directory)
}

@Suite("The relay's check of a device on every circuit")
struct RelayIdentityCheckTests {
    enum Change: String, CaseIterable, Sendable {
        case revoked, disabled, deleted, reissued
    }

    /// A device's connection outlives a change to its identity for a moment (the controller then closes it); a
    /// circuit opened in that moment is refused with the words a new connection would get, not a vaguer one.
    @Test(
        "a circuit from an identity changed since its connection was made is refused, saying why",
        arguments: Change.allCases
    )
    func refusedWithTheReason(change: Change) async throws {
        let (state, directory) = try await temporaryControllerState()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        var device = try await activeDevice(in: state)
        let relay = Relay(
            controller: Controller(state: state),
            live: LiveConnections(),
            gatewayTimeout: .seconds(1),
            logger: Logger(label: "test", factory: { _ in SwiftLogNoOpLogHandler() })
        )
        let stream = EmbeddedChannel()
        // Before the change, the check passes: no gateway hosts the service, which is the next refusal.
        guard
            case .refuse(503, "service_unavailable", _) = try await relay.dial(
                service: "claude-api",
                device: device,
                stream: stream
            ).get()
        else {
            Issue.record("an active device was not let through the identity check")
            return
        }
        let expected: String
        switch change {
        case .revoked, .disabled:
            // Through the controller, as the admin API does: it keeps the directory the relay reads current.
            _ = try await Controller(state: state).changeState(
                name: "phone",
                to: change == .revoked ? .revoked : .disabled,
                actor: "test"
            )
            expected = "identity 'phone' is \(change.rawValue)"
        case .deleted:
            try await Controller(state: state).deleteIdentity(named: "phone", actor: "test")
            expected = "this identity certificate is no longer valid"
        case .reissued:
            device.certificateFingerprint = "replaced"
            expected = "this identity certificate is no longer valid"
        }
        let decision = try await relay.dial(service: "claude-api", device: device, stream: stream).get()
        guard case .refuse(let status, let code, let reason) = decision else {
            Issue.record("a \(change) identity was let through")
            return
        }
        #expect(status == 403)
        #expect(code == "identity_blocked")
        #expect(reason == expected)
        _ = try stream.finish()
    }
}

@Suite("A gateway that does not answer a circuit in time")
struct RelayGatewayTimeoutTests {
    /// A relay with one registered gateway link whose gateway end records each circuit's frames and never answers,
    /// and a device stream (active, as a device's HTTP/2 stream is) that has asked it for a circuit: the gateway got
    /// the CONNECT and the relay is waiting for its answer.
    struct SilentGateway {
        let loop = EmbeddedEventLoop()
        let controllerSide: EmbeddedChannel
        let gatewaySide: EmbeddedChannel
        let deviceStream: EmbeddedChannel
        let relay: Relay
        let received = NIOLockedValueBox<[HTTP2Frame.FramePayload]>([])
        let decided = NIOLockedValueBox<CircuitDecision?>(nil)

        init(state: ControllerState, gatewayTimeout: TimeAmount) async throws {
            let device = try await activeDevice(in: state)
            let gateway = try await activeDevice(in: state, name: "gw", role: .gateway)
            // The controller's end of a gateway link (HTTP/2 client: the relay opens the streams) and the gateway's.
            controllerSide = EmbeddedChannel(loop: loop)
            gatewaySide = EmbeddedChannel(loop: loop)
            let received = self.received
            try gatewaySide.pipeline.syncOperations.configureFabricHTTP2(mode: .server) {
                FrameRecorder { payload in received.withLockedValue { $0.append(payload) } }
            }
            let multiplexer = try controllerSide.pipeline.syncOperations.configureFabricHTTP2(mode: .client)
            let address = try SocketAddress(ipAddress: "127.0.0.1", port: 1)
            controllerSide.connect(to: address, promise: nil)
            gatewaySide.connect(to: address, promise: nil)
            relay = Relay(
                controller: Controller(state: state),
                live: LiveConnections(),
                gatewayTimeout: gatewayTimeout,
                logger: Logger(label: "test", factory: { _ in SwiftLogNoOpLogHandler() })
            )
            relay.register(
                .init(
                    key: ObjectIdentifier(controllerSide),
                    identity: gateway,
                    channel: controllerSide,
                    multiplexer: multiplexer
                ),
                service: "claude-api"
            )
            deviceStream = EmbeddedChannel(loop: loop)
            deviceStream.connect(to: address, promise: nil)
            let decided = self.decided
            relay.dial(service: "claude-api", device: device, stream: deviceStream).whenSuccess { decision in
                decided.withLockedValue { $0 = decision }
            }
            try exchange()
        }

        /// Runs what is due on the loop and carries the bytes between the two ends of the link.
        func exchange() throws {
            loop.run()
            try exchangeBytes(controllerSide, gatewaySide)
        }

        var gatewayStreamWasReset: Bool {
            received.withLockedValue { $0 }.contains { if case .rstStream = $0 { true } else { false } }
        }

        func finish() {
            _ = try? deviceStream.finish()
            _ = try? controllerSide.finish()
            _ = try? gatewaySide.finish()
        }
    }

    /// The relay gives up on a gateway that takes longer than `gatewayTimeout` to answer a circuit, and the device is
    /// refused. The stream it opened to that gateway must not stay open: a late answer would otherwise leave the
    /// gateway holding a circuit (and a backend request) nobody relays, until the link closes.
    @Test("the relay closes the stream to a gateway it gave up on, and refuses the device")
    func closesTheAbandonedStream() async throws {
        let (state, directory) = try await temporaryControllerState()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let link = try await SilentGateway(state: state, gatewayTimeout: .seconds(1))
        defer { link.finish() }
        #expect(
            link.received.withLockedValue { $0.count } == 1,
            "the gateway got the circuit's CONNECT: \(link.received.withLockedValue { $0 })"
        )
        #expect(
            link.decided.withLockedValue { $0 } == nil,
            "decided before the gateway answered or the timeout ran out"
        )

        link.loop.advanceTime(by: .seconds(2))
        try link.exchange()
        let decision = link.decided.withLockedValue { $0 }
        guard case .refuse(502, "gateway_failed", _) = decision else {
            Issue.record("the device was not refused after the timeout: \(String(describing: decision))")
            return
        }
        #expect(
            link.gatewayStreamWasReset,
            "the gateway's stream was left open: \(link.received.withLockedValue { $0 })"
        )
    }

    /// A device that resets its stream (HEADERS then RST_STREAM) while the gateway has not answered yet: the relay
    /// stops waiting at once and resets the gateway's stream, instead of leaving it open until the timeout (and,
    /// when the gateway answers, until the gateway's handshake timeout: one idle stream per reset on the link).
    @Test("a device stream reset during the dial resets the gateway's stream at once; no splice")
    func deviceResetDuringTheDial() async throws {
        let (state, directory) = try await temporaryControllerState()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let link = try await SilentGateway(state: state, gatewayTimeout: .seconds(60))
        defer { link.finish() }
        #expect(link.received.withLockedValue { $0.count } == 1, "the gateway got the circuit's CONNECT")

        // The device goes away; no time passes (the gateway timeout is a minute away).
        _ = try? link.deviceStream.finish()
        try link.exchange()
        let decision = link.decided.withLockedValue { $0 }
        guard case .refuse(499, "closed", _) = decision else {
            Issue.record("the relay still waited for the gateway: \(String(describing: decision))")
            return
        }
        #expect(
            link.gatewayStreamWasReset,
            "the gateway's stream was left open: \(link.received.withLockedValue { $0 })"
        )
        #expect(link.relay.sessions().isEmpty)
    }
}

/// An enrolled, active device identity in `state`'s store.
func activeDevice(in state: ControllerState, name: String = "phone", role: IdentityRole = .device) async throws
    -> IdentityRecord
{
    let device = IdentityRecord(
        id: UUID().uuidString,
        name: name,
        role: role,
        attributes: [],
        state: .pending,
        createdAt: 0
    )
    try await state.store.createIdentity(
        device,
        token: TokenRecord(jti: "jti-\(name)", identityID: device.id, createdAt: 0, expiresAt: .max),
        actor: "test"
    )
    let record = try await state.store.consumeToken(
        jti: "jti-\(name)",
        identityID: device.id,
        now: 1,
        certificate: EnrolledCertificate(fingerprint: "current", notAfter: .max, publicKey: "key")
    )
    // Written behind the controller's back: the directory the data path reads is told, as a reload would.
    state.identities.apply(record)
    return record
}

/// An active gateway identity (not stored: the relay and the control handler only carry it).
func gatewayRecord(name: String = "gw") -> IdentityRecord {
    IdentityRecord(id: UUID().uuidString, name: name, role: .gateway, attributes: [], state: .active, createdAt: 0)
}
