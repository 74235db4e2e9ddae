import Foundation
import ILSCore
import ILSFabric
import ILSTesting
import Logging
import NIOConcurrencyHelpers
import NIOCore
import NIOEmbedded
import NIOHTTP2
import Testing

@testable import ILSController

/// The relay opens circuits only on gateway links made with the gateway identity's current certificate: a link made
/// with a certificate that `renew` or `reissue` replaced (a copy of the old identity file still running) gets none.
@Suite("The relay's check of a gateway link's certificate on every circuit")
struct RelayHostCertificateTests {
    /// A gateway link between two embedded channels; the gateway end records what it receives and never answers.
    struct Link {
        let controllerSide: EmbeddedChannel
        let gatewaySide: EmbeddedChannel
        let multiplexer: NIOHTTP2Handler.StreamMultiplexer
        let received: NIOLockedValueBox<[HTTP2Frame.FramePayload]>

        init(loop: EmbeddedEventLoop) throws {
            controllerSide = EmbeddedChannel(loop: loop)
            gatewaySide = EmbeddedChannel(loop: loop)
            let received = NIOLockedValueBox<[HTTP2Frame.FramePayload]>([])
            self.received = received
            try gatewaySide.pipeline.syncOperations.configureFabricHTTP2(mode: .server) {
                FrameRecorder { payload in received.withLockedValue { $0.append(payload) } }
            }
            multiplexer = try controllerSide.pipeline.syncOperations.configureFabricHTTP2(mode: .client)
            let address = try SocketAddress(ipAddress: "127.0.0.1", port: 1)
            controllerSide.connect(to: address, promise: nil)
            gatewaySide.connect(to: address, promise: nil)
        }
    }

    @Test(
        "a link made with a replaced certificate gets no circuit and is closed; one with the current certificate gets it",
        arguments: [false, true]
    )
    func supersededLinkGetsNoCircuit(current: Bool) async throws {
        let (state, directory) = try await temporaryControllerState()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let device = try await activeDevice(in: state)
        var gateway = try await activeDevice(in: state, name: "gw", role: .gateway)
        // What the link was authenticated with: the store's current fingerprint, or the one before a renewal.
        if !current { gateway.certificateFingerprint = "before-renewal" }
        let loop = EmbeddedEventLoop()
        let link = try Link(loop: loop)
        let relay = Relay(
            controller: Controller(state: state),
            live: LiveConnections(),
            gatewayTimeout: .seconds(1),
            logger: Logger(label: "test", factory: { _ in SwiftLogNoOpLogHandler() })
        )
        relay.register(
            .init(
                key: ObjectIdentifier(link.controllerSide),
                identity: gateway,
                channel: link.controllerSide,
                multiplexer: link.multiplexer
            ),
            service: "claude-api"
        )
        let deviceStream = EmbeddedChannel(loop: loop)
        // Active, as a device's HTTP/2 stream is: the relay asks no gateway for a stream that closed.
        deviceStream.connect(to: try SocketAddress(ipAddress: "127.0.0.1", port: 1), promise: nil)
        let decided = NIOLockedValueBox<CircuitDecision?>(nil)
        relay.dial(service: "claude-api", device: device, stream: deviceStream).whenSuccess { decision in
            decided.withLockedValue { $0 = decision }
        }
        loop.run()
        try? exchangeBytes(link.controllerSide, link.gatewaySide)
        let heads = link.received.withLockedValue { $0 }.filter { if case .headers = $0 { true } else { false } }
        if current {
            #expect(heads.count == 1, "the current link did not get the circuit")
            #expect(decided.withLockedValue { $0 } == nil)
            #expect(link.controllerSide.isActive)
        } else {
            #expect(heads.isEmpty, "a link with a replaced certificate got a circuit")
            guard case .refuse(502, "gateway_failed", _) = decided.withLockedValue({ $0 }) else {
                Issue.record("the device was not refused: \(String(describing: decided.withLockedValue { $0 }))")
                return
            }
            #expect(!link.controllerSide.isActive, "an idle link with a replaced certificate was kept open")
        }
        _ = try? deviceStream.finish()
        _ = try? link.controllerSide.finish()
        _ = try? link.gatewaySide.finish()
    }
}
