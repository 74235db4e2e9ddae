import Foundation
import ILSClient
import ILSCore
import ILSFabric
import ILSTesting
import NIOConcurrencyHelpers
import NIOCore
import NIOPosix
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// How a circuit ended, as the layer above the end-to-end handler saw it.
final class EndRecorder: ChannelInboundHandler, Sendable {
    typealias InboundIn = ByteBuffer

    struct Seen {
        var bytes = ""
        var count = 0
        var ended = false
        var errors: [String] = []
        var truncated = false
    }

    let seen = NIOLockedValueBox(Seen())
    let closed: EventLoopPromise<Void>

    init(closed: EventLoopPromise<Void>) { self.closed = closed }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        let buffer = unwrapInboundIn(data)
        let text = String(buffer: buffer)
        seen.withLockedValue {
            $0.bytes += text
            $0.count += buffer.readableBytes
        }
    }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        if case ChannelEvent.inputClosed = event {
            seen.withLockedValue { $0.ended = true }
            // What an app does once the answer is complete.
            context.close(promise: nil)
        }
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        seen.withLockedValue {
            $0.errors.append("\(error)")
            if (error as? E2ECircuitError) == .truncated { $0.truncated = true }
        }
    }

    func channelInactive(context: ChannelHandlerContext) {
        closed.succeed()
    }
}

/// Bytes a plain TCP client read, and whether its connection ended with a reset or a clean end of file.
final class SocketEnd: ChannelInboundHandler, Sendable {
    typealias InboundIn = ByteBuffer
    let bytes = NIOLockedValueBox("")
    let reset = NIOLockedValueBox(false)

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        let text = String(buffer: unwrapInboundIn(data))
        bytes.withLockedValue { $0 += text }
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        if let error = error as? IOError, error.errnoCode == ECONNRESET { reset.withLockedValue { $0 = true } }
        context.close(promise: nil)
    }
}

@Suite("How circuits end, through a real controller and gateway", .clusterExclusive)
struct CircuitEndTests {
    /// Dials the service as `ipad`, sends `request`, and waits for the circuit to close.
    static func exchange(_ cluster: TestCluster, _ request: String) async throws -> EndRecorder.Seen {
        let dialer = try OverlayDialer(identity: try await cluster.enroll("phone", role: .device))
        let circuit = try await dialer.dial(service: "claude-api").get()
        let recorder = EndRecorder(closed: circuit.eventLoop.makePromise())
        try await circuit.eventLoop.submit {
            try circuit.pipeline.syncOperations.addHandler(recorder)
        }.get()
        try await circuit.writeAndFlush(ByteBuffer(string: request))
        try await recorder.closed.futureResult.get()
        return recorder.seen.withLockedValue { $0 }
    }

    @Test("an answer the gateway ends with Connection: close arrives whole, with the gateway's FINAL, and no error")
    func cleanEndIsFinal() async throws {
        try await withCluster { cluster in
            let seen = try await Self.exchange(
                cluster,
                "GET /health HTTP/1.1\r\nHost: claude-api\r\nConnection: close\r\n\r\n"
            )
            #expect(seen.bytes.hasPrefix("HTTP/1.1 200"))
            #expect(seen.bytes.hasSuffix("ok"))
            #expect(seen.ended)
            #expect(seen.errors.isEmpty)
        }
    }

    @Test("an answer cut by the backend mid-body reaches the device app as truncated, never as an end")
    func cutIsTruncated() async throws {
        try await withCluster { cluster in
            let seen = try await Self.exchange(cluster, "GET /die-mid-stream HTTP/1.1\r\nHost: claude-api\r\n\r\n")
            #expect(seen.bytes.contains("data: first"))
            #expect(!seen.ended)
            #expect(seen.truncated)
        }
    }

    @Test("the tunnel resets its client's connection when the circuit is cut, and ends it cleanly otherwise")
    func tunnelResetsOnTruncation() async throws {
        try await withCluster { cluster in
            for (path, expectReset) in [("/die-mid-stream", true), ("/health", false)] {
                let end = SocketEnd()
                let client = try await ClientBootstrap(group: MultiThreadedEventLoopGroup.singleton)
                    .channelInitializer { channel in
                        channel.eventLoop.makeCompletedFuture { try channel.pipeline.syncOperations.addHandler(end) }
                    }
                    .connect(host: "127.0.0.1", port: cluster.tunnelPort).get()
                try await client.writeAndFlush(
                    ByteBuffer(string: "GET \(path) HTTP/1.1\r\nHost: claude-api\r\nConnection: close\r\n\r\n")
                )
                try await client.closeFuture.get()
                #expect(end.bytes.withLockedValue { $0 }.hasPrefix("HTTP/1.1 200"), "\(path)")
                #expect(end.reset.withLockedValue { $0 } == expectReset, "\(path)")
            }
        }
    }
}
