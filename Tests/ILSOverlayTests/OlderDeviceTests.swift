import ILSClient
import ILSCore
import ILSCrypto
import ILSSodium
import ILSTesting
import NIOConcurrencyHelpers
import NIOCore
import NIOPosix
import Testing

/// Gathers everything a dialled circuit delivers until it closes.
private final class Gather: ChannelInboundHandler, Sendable {
    typealias InboundIn = ByteBuffer
    let received = NIOLockedValueBox<[UInt8]>([])

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        let buffer = unwrapInboundIn(data)
        received.withLockedValue { $0 += buffer.readableBytesView }
    }
}

@Suite("Devices built before handshake version 3", .clusterExclusive)
struct OlderDeviceTests {
    /// The backend's `/headers` answer through a circuit `dialer` opens, whole (the circuit closes after it).
    static func headers(through dialer: OverlayDialer) async throws -> String {
        let circuit = try await dialer.dial(service: "claude-api").get()
        let gather = Gather()
        try await circuit.pipeline.addHandler(gather).get()
        let request = "GET /headers HTTP/1.1\r\nHost: claude-api\r\nConnection: close\r\n\r\n"
        try? await circuit.writeAndFlush(ByteBuffer(string: request)).get()
        try await circuit.closeFuture.get()
        return String(decoding: gather.received.withLockedValue { $0 }, as: UTF8.self)
    }

    @Test("a real gateway serves devices speaking versions 1, 2 and 3 side by side", arguments: [UInt8(1), 2, 3])
    func everyVersionGetsACircuit(version: UInt8) async throws {
        try await withCluster { cluster in
            let identity = try await cluster.enroll("device-v\(version)", role: .device)
            let speaking = E2EHandshakeVersions.all.first { $0.number == version }!
            let dialer = try OverlayDialer(
                identity: identity,
                eventLoop: MultiThreadedEventLoopGroup.singleton.next(),
                keepalive: .standard,
                handshakeVersion: speaking,
                earlyHello: false  // built before ils-dial/2 too
            )
            let response = try await Self.headers(through: dialer)
            #expect(response.hasPrefix("HTTP/1.1 200"))
            #expect(response.contains("x-ils-identity: device-v\(version)"))
        }
    }

    @Test(
        "a device of an earlier release (ils-dial/1: it waits for the answer before its ClientHello) and one of this release (ils-dial/2: the ClientHello goes with the CONNECT) both get circuits",
        arguments: [false, true]
    )
    func earlyHelloOrNot(earlyHello: Bool) async throws {
        try await withCluster { cluster in
            let identity = try await cluster.enroll("device-early-\(earlyHello)", role: .device)
            let dialer = try OverlayDialer(
                identity: identity,
                eventLoop: MultiThreadedEventLoopGroup.singleton.next(),
                keepalive: .standard,
                handshakeVersion: E2EHandshake.version,
                earlyHello: earlyHello
            )
            #expect(try await dialer.sendsEarlyHello.get() == earlyHello)
            for round in 0..<3 {
                let response = try await Self.headers(through: dialer)
                #expect(response.hasPrefix("HTTP/1.1 200"), "round \(round)")
                #expect(response.contains("x-ils-identity: device-early-\(earlyHello)"))
            }
        }
    }

    @Test("ils-dial/2: a refused circuit whose ClientHello went early fails with the controller's reason")
    func earlyHelloRefused() async throws {
        try await withCluster { cluster in
            let identity = try await cluster.enroll("device-early-refused", role: .device)
            let dialer = try OverlayDialer(identity: identity)
            #expect(try await dialer.sendsEarlyHello.get())
            await #expect(throws: OverlayDialer.DialError.self) {
                _ = try await dialer.dial(service: "no-such-service").get()
            }
            // The connection carries on: the next circuit is served.
            let circuit = try await dialer.dial(service: "claude-api").get()
            circuit.close(promise: nil)
        }
    }
}
