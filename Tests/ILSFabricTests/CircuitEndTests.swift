import Crypto
import ILSCore
import ILSCrypto
import ILSFabric
import ILSTesting
import NIOConcurrencyHelpers
import NIOCore
import NIOEmbedded
import NIOHTTP2
import Testing

/// The two ends of one circuit as HTTP/2 streams would carry it (`StreamDataCodec` at the bottom of each, DATA
/// payloads between them), in embedded channels: what a relay can do to the stream is done by hand.
struct EmbeddedCircuit {
    let device: EmbeddedChannel
    let gateway: EmbeddedChannel
    let deviceSeen: Seen
    let gatewaySeen: Seen

    /// What the layer above an end-to-end handler saw.
    final class Seen: ChannelInboundHandler, Sendable {
        typealias InboundIn = ByteBuffer
        struct State {
            var bytes = ""
            var ended = false
            var errors: [any Error] = []
        }
        let state = NIOLockedValueBox(State())

        var ended: Bool { state.withLockedValue { $0.ended } }
        var bytes: String { state.withLockedValue { $0.bytes } }
        var truncated: Bool {
            state.withLockedValue { $0.errors.contains { ($0 as? E2ECircuitError) == .truncated } }
        }
        var errorCount: Int { state.withLockedValue { $0.errors.count } }
        var cancelled: Bool {
            state.withLockedValue { $0.errors.contains { ($0 as? E2ECircuitError) == .cancelled } }
        }

        func channelRead(context: ChannelHandlerContext, data: NIOAny) {
            let text = String(buffer: unwrapInboundIn(data))
            state.withLockedValue { $0.bytes += text }
        }

        func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
            if case ChannelEvent.inputClosed = event { state.withLockedValue { $0.ended = true } }
        }

        func errorCaught(context: ChannelHandlerContext, error: any Error) {
            state.withLockedValue { $0.errors.append(error) }
        }
    }

    /// A circuit whose handshake has completed; the device speaks `deviceVersion`.
    init(deviceVersion: any E2EHandshakeVersion = E2EHandshake.version) throws {
        let authority = try CertificateAuthority.create(name: "test CA")
        let deviceSeen = Seen()
        let gatewaySeen = Seen()
        device = EmbeddedChannel(handlers: [
            StreamDataCodec(),
            ByteToMessageHandler(FrameDecoder()),
            E2EInitiatorHandler(
                credentials: try TestIdentities.credentials(authority, name: "ipad", role: .device),
                service: "claude-api",
                version: deviceVersion
            ),
            deviceSeen,
        ])
        gateway = EmbeddedChannel(
            handlers: [
                StreamDataCodec(),
                ByteToMessageHandler(FrameDecoder()),
                E2EResponderHandler(
                    credentials: try TestIdentities.credentials(authority, name: "gw", role: .gateway),
                    authorize: { _, _ in .allow },
                    onEstablished: { channel, _ in try channel.pipeline.syncOperations.addHandler(gatewaySeen) }
                ),
            ],
            loop: device.embeddedEventLoop
        )
        self.deviceSeen = deviceSeen
        self.gatewaySeen = gatewaySeen
        try gateway.connect(to: SocketAddress(ipAddress: "127.0.0.1", port: 2)).wait()
        try device.connect(to: SocketAddress(ipAddress: "127.0.0.1", port: 1)).wait()
        _ = try pump()
    }

    /// Moves DATA both ways until neither side has anything left; returns whether each side sent END_STREAM.
    @discardableResult
    func pump() throws -> (deviceEnded: Bool, gatewayEnded: Bool) {
        var ends = (deviceEnded: false, gatewayEnded: false)
        var moved = true
        while moved {
            moved = false
            while let frame = try device.readOutbound(as: HTTP2Frame.FramePayload.self) {
                if case .data(let data) = frame, data.endStream { ends.deviceEnded = true }
                if gateway.isActive { try gateway.writeInbound(frame) }
                moved = true
            }
            while let frame = try gateway.readOutbound(as: HTTP2Frame.FramePayload.self) {
                if case .data(let data) = frame, data.endStream { ends.gatewayEnded = true }
                if device.isActive { try device.writeInbound(frame) }
                moved = true
            }
        }
        return ends
    }

    /// What a relay cutting the stream does to one end: END_STREAM with no FINAL record before it.
    static let bareEnd = HTTP2Frame.FramePayload.data(.init(data: .byteBuffer(ByteBuffer()), endStream: true))

    func finish() {
        _ = try? device.finish(acceptAlreadyClosed: true)
        _ = try? gateway.finish(acceptAlreadyClosed: true)
    }
}

@Suite("How a circuit ends: FINAL is a clean end, anything else a truncation")
struct CircuitEndTests {
    /// A writer waits on a held write's promise while the circuit is not writable (until the handshake is done):
    /// a circuit that closes mid-handshake without a refusal must fail those promises, or the writer waits for good.
    @Test("writes held for the handshake fail when the circuit closes before it is done")
    func heldWritesFailWhenClosedMidHandshake() throws {
        let authority = try CertificateAuthority.create(name: "test CA")
        let device = try CircuitFixture.credentials(authority, name: "ipad", role: .device)
        let channel = EmbeddedChannel()
        try channel.pipeline.syncOperations.addHandler(E2EInitiatorHandler(credentials: device, service: "claude-api"))
        try channel.connect(to: SocketAddress(ipAddress: "127.0.0.1", port: 1)).wait()
        let held = channel.eventLoop.makePromise(of: Void.self)
        let failed = NIOLockedValueBox(false)
        held.futureResult.whenFailure { _ in failed.withLockedValue { $0 = true } }
        channel.writeAndFlush(ByteBuffer(string: "POST /upload HTTP/1.1\r\n\r\n"), promise: held)
        _ = try? channel.finish()
        #expect(failed.withLockedValue { $0 }, "the held write's promise never completed")
    }

    @Test("the gateway's clean end (FINAL, END_STREAM) reaches the device app as the end of input, not an error")
    func gatewayCleanEnd() throws {
        let circuit = try EmbeddedCircuit()
        defer { circuit.finish() }
        circuit.gateway.write(ByteBuffer(string: "answer"), promise: nil)
        circuit.gateway.close(mode: .output, promise: nil)
        #expect(try circuit.pump().gatewayEnded)
        #expect(circuit.deviceSeen.bytes == "answer")
        #expect(circuit.deviceSeen.ended)
        #expect(circuit.deviceSeen.errorCount == 0)
    }

    @Test("END_STREAM from the gateway's side without FINAL reaches the device app as truncated, and no end")
    func deviceSeesBareEndAsTruncated() throws {
        let circuit = try EmbeddedCircuit()
        defer { circuit.finish() }
        circuit.gateway.writeAndFlush(ByteBuffer(string: "part of an answer"), promise: nil)
        try circuit.pump()
        try circuit.device.writeInbound(EmbeddedCircuit.bareEnd)
        #expect(circuit.deviceSeen.bytes == "part of an answer")
        #expect(circuit.deviceSeen.truncated)
        #expect(!circuit.deviceSeen.ended)
        #expect(!circuit.device.isActive)
    }

    @Test("a reset stream is truncated before the gateway's FINAL, and not after it")
    func resetIsTruncatedOnlyBeforeFinal() throws {
        let reset = NIOHTTP2Errors.streamClosed(streamID: 1, errorCode: .cancel)
        let cut = try EmbeddedCircuit()
        defer { cut.finish() }
        cut.device.pipeline.fireErrorCaught(reset)
        #expect(cut.deviceSeen.truncated)

        let clean = try EmbeddedCircuit()
        defer { clean.finish() }
        clean.gateway.close(mode: .output, promise: nil)
        try clean.pump()
        clean.device.pipeline.fireErrorCaught(reset)
        #expect(clean.deviceSeen.ended)
        #expect(!clean.deviceSeen.truncated)
    }

    @Test("a device half-close is FINAL then END_STREAM; the gateway's proxy core sees a clean end")
    func deviceCleanEnd() throws {
        let circuit = try EmbeddedCircuit()
        defer { circuit.finish() }
        circuit.device.write(ByteBuffer(string: "request"), promise: nil)
        circuit.device.close(mode: .output, promise: nil)
        #expect(try circuit.pump().deviceEnded)
        #expect(circuit.gatewaySeen.bytes == "request")
        #expect(circuit.gatewaySeen.ended)
        #expect(circuit.gatewaySeen.errorCount == 0)
    }

    @Test("a request cut without FINAL reaches the gateway's proxy core as truncated, and the circuit closes")
    func gatewaySeesBareEndAsTruncated() throws {
        let circuit = try EmbeddedCircuit()
        defer { circuit.finish() }
        circuit.device.writeAndFlush(ByteBuffer(string: "POST /upload HTTP/1.1\r\n"), promise: nil)
        try circuit.pump()
        try circuit.gateway.writeInbound(EmbeddedCircuit.bareEnd)
        #expect(circuit.gatewaySeen.truncated)
        #expect(!circuit.gatewaySeen.ended)
        #expect(!circuit.gateway.isActive)
    }

    @Test("the device app's close after the gateway's FINAL is clean: FINAL and END_STREAM, no reset")
    func deviceCloseAfterAnswerIsClean() throws {
        let circuit = try EmbeddedCircuit()
        defer { circuit.finish() }
        circuit.gateway.close(mode: .output, promise: nil)
        try circuit.pump()
        circuit.device.close(promise: nil)
        #expect(try circuit.pump().deviceEnded)
        #expect(circuit.gatewaySeen.ended)
        #expect(circuit.gatewaySeen.errorCount == 0)
    }

    @Test("the device app's close before the answer ended is abortive: no FINAL, the gateway sees a cut")
    func deviceCloseMidAnswerIsAbortive() throws {
        let circuit = try EmbeddedCircuit()
        defer { circuit.finish() }
        circuit.device.close(promise: nil)
        #expect(try !circuit.pump().deviceEnded)
        #expect(!circuit.device.isActive)
    }

    @Test("a device that gives up mid-answer seals a CANCEL (suite 4): the gateway's proxy core sees cancelled")
    func deviceCancelIsSealed() throws {
        let circuit = try EmbeddedCircuit()
        defer { circuit.finish() }
        circuit.device.close(promise: nil)
        #expect(try !circuit.pump().deviceEnded)
        #expect(circuit.gatewaySeen.cancelled)
        #expect(!circuit.gatewaySeen.truncated)
        #expect(!circuit.gateway.isActive)
    }

    /// How the gateway tells the two apart: a device that offered suite 4 seals its cancels; one of an earlier
    /// release agreed suite 3 and cannot, so its reset is taken as a cancel, as before.
    @Test("a device limited to suite 3 sends no CANCEL: its reset reaches the gateway as a cut, as before")
    func suiteThreeDeviceCannotCancel() throws {
        let circuit = try EmbeddedCircuit(deviceVersion: SuiteThreeDevice())
        defer { circuit.finish() }
        circuit.device.close(promise: nil)
        try circuit.pump()
        #expect(!circuit.gatewaySeen.cancelled)
        circuit.gateway.pipeline.fireErrorCaught(NIOHTTP2Errors.streamClosed(streamID: 1, errorCode: .cancel))
        #expect(circuit.gatewaySeen.truncated)
    }
}

/// Version 3 as a device of the release before suite 4 speaks it: it offers suite 3 only.
struct SuiteThreeDevice: E2EHandshakeVersion {
    private let v3 = E2EHandshakeV3()
    var number: UInt8 { v3.number }
    var suites: [E2ESuite] { [.aes256gcmHKDF] }
    func transcript(_ parts: [[UInt8]]) -> [UInt8] { v3.transcript(parts) }
    func keys(
        sharedSecret: SharedSecret,
        initiatorEphemeral: [UInt8],
        responderEphemeral: [UInt8],
        transcript: [UInt8]
    ) -> E2EDirectionKeys {
        v3.keys(
            sharedSecret: sharedSecret,
            initiatorEphemeral: initiatorEphemeral,
            responderEphemeral: responderEphemeral,
            transcript: transcript
        )
    }
    func sender(suite: E2ESuite, key: [UInt8], recordsPerKey: UInt64) -> E2ERecordSender {
        v3.sender(suite: suite, key: key, recordsPerKey: recordsPerKey)
    }
    func receiver(suite: E2ESuite, key: [UInt8], header: [UInt8], recordsPerKey: UInt64) throws(ILSError)
        -> E2ERecordReceiver
    {
        try v3.receiver(suite: suite, key: key, header: header, recordsPerKey: recordsPerKey)
    }
}
