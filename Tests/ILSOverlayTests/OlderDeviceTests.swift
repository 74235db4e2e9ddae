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
    @Test("a real gateway serves devices speaking versions 1, 2 and 3 side by side", arguments: [UInt8(1), 2, 3])
    func everyVersionGetsACircuit(version: UInt8) async throws {
        try await withCluster { cluster in
            let identity = try await cluster.enroll("device-v\(version)", role: .device)
            let speaking = E2EHandshakeVersions.all.first { $0.number == version }!
            let dialer = try OverlayDialer(
                identity: identity,
                eventLoop: MultiThreadedEventLoopGroup.singleton.next(),
                keepalive: .standard,
                handshakeVersion: speaking
            )
            let circuit = try await dialer.dial(service: "claude-api").get()
            let gather = Gather()
            try await circuit.pipeline.addHandler(gather).get()
            let request = "GET /headers HTTP/1.1\r\nHost: claude-api\r\nConnection: close\r\n\r\n"
            try? await circuit.writeAndFlush(ByteBuffer(string: request)).get()
            try await circuit.closeFuture.get()
            let response = String(decoding: gather.received.withLockedValue { $0 }, as: UTF8.self)
            #expect(response.hasPrefix("HTTP/1.1 200"))
            #expect(response.contains("x-ils-identity: device-v\(version)"))
        }
    }
}
