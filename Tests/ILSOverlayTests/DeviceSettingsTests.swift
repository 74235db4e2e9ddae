import ILSClient
import ILSCore
import ILSCrypto
import ILSFabric
import ILSTesting
import NIOConcurrencyHelpers
import NIOCore
import NIOHTTP2
import NIOPosix
import Testing

/// docs/protocol.md: nothing beyond RFC 9113 is required of a device's HTTP/2 settings.
@Suite("A device's HTTP/2 settings", .clusterExclusive)
struct DeviceSettingsTests {
    @Test("a device with HTTP/2's default settings (16 KiB frames, 64 KiB windows) gets a multi-record answer whole")
    func defaultSettings() async throws {
        try await withCluster { cluster in
            let identity = try await cluster.enroll("plain", role: .device)
            let credentials = try E2EHandshake.Credentials(
                certificatePEM: identity.certificate,
                privateKeyPEM: identity.privateKey,
                caCertificatePEM: identity.caCertificate
            )
            let eventLoop = MultiThreadedEventLoopGroup.singleton.next()
            let multiplexer = NIOLockedValueBox<NIOHTTP2Handler.StreamMultiplexer?>(nil)
            let connection = try await FabricConnector(identity: identity, alpn: FabricProtocol.dialALPN)
                .connect(on: eventLoop) { channel in
                    // swift-nio-http2's defaults, not FabricSettings: what any HTTP/2 client library starts with.
                    let made = try channel.pipeline.syncOperations.configureHTTP2Pipeline(
                        mode: .client,
                        connectionConfiguration: .init(),
                        streamConfiguration: .init()
                    ) { $0.close() }
                    multiplexer.withLockedValue { $0 = made }
                }.get()
            let opened = eventLoop.makePromise(of: Void.self)
            let stream = try await multiplexer.withLockedValue { $0 }!.createStreamChannel { stream in
                stream.eventLoop.makeCompletedFuture {
                    try stream.pipeline.syncOperations.addHandler(CircuitDialer(service: "claude-api", opened: opened))
                }
            }.get()
            try await opened.futureResult.get()
            let recorder = EndRecorder(closed: stream.eventLoop.makePromise())
            try await stream.eventLoop.submit {
                let pipeline = stream.pipeline.syncOperations
                try pipeline.addHandler(StreamDataCodec())
                try pipeline.addHandler(ByteToMessageHandler(FrameDecoder()))
                try pipeline.addHandler(E2EInitiatorHandler(credentials: credentials, service: "claude-api"))
                try pipeline.addHandler(recorder)
            }.get()
            // Four records, each spanning five DATA frames and more than one stream window. Slow with these settings
            // (about 250 KiB/s on loopback: 3 MiB took 15 s), which is why the text recommends larger windows and frames.
            let size = 256 * 1024
            try await stream.writeAndFlush(
                ByteBuffer(string: "GET /bytes?size=\(size) HTTP/1.1\r\nHost: claude-api\r\nConnection: close\r\n\r\n")
            )
            try await recorder.closed.futureResult.get()
            let seen = recorder.seen.withLockedValue { $0 }
            #expect(seen.ended && seen.errors.isEmpty)
            #expect(seen.bytes.hasPrefix("HTTP/1.1 200"))
            #expect(seen.count > size)
            try? await connection.close()
        }
    }
}
