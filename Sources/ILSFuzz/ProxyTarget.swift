import ILSCore
import ILSProxy
import NIOConcurrencyHelpers
import NIOCore
import NIOEmbedded

/// The HTTP request path of the proxy core: raw bytes from a client into `ProxyCore`'s pipeline (NIO's HTTP/1.1
/// decoder with the core's limits, `ProxyServerHandler`, `HeaderRewriter`), as on a decrypted circuit with a
/// verified identity.
///
/// The backend is in process: each connection the pool opens is an `EmbeddedChannel` on the same loop with the
/// pool's real pipeline, which answers every burst of request bytes with a small response (a 101 to an upgrade). At
/// the end the clock jumps past every timeout, so the idle, stall and header timers fire too.
enum ProxyTarget {
    static let response = ByteBuffer(
        string: "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Type: text/plain\r\n\r\nok"
    )
    static let switching = ByteBuffer(
        string: "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n"
    )

    /// A 101 to what carries an `Upgrade` header (so the upgraded, raw-bytes path runs too), a 200 to the rest.
    private static func answer(to request: [UInt8]) -> ByteBuffer {
        String(decoding: request, as: UTF8.self).lowercased().contains("\r\nupgrade:") ? switching : response
    }

    static func run(_ data: UnsafeRawBufferPointer) {
        let loop = EmbeddedEventLoop()
        let backends = NIOLockedValueBox<[EmbeddedChannel]>([])
        let configuration = ProxyConfiguration(backend: BackendURL(host: "127.0.0.1", port: 8000))
        let pools = BackendPool(configuration: configuration, loopCount: 1) { _, _, initialize in
            let backend = EmbeddedChannel(loop: loop)
            backends.withLockedValue { $0.append(backend) }
            return initialize(backend).flatMap {
                backend.connect(to: try! SocketAddress(ipAddress: "127.0.0.1", port: 8000))
            }.map { backend }
        }
        let core = ProxyCore(configuration: configuration, logger: FuzzFixtures.logger, pools: pools)
        let client = EmbeddedChannel(loop: loop)
        do {
            try core.configureClientPipeline(
                client.pipeline.syncOperations,
                client: ClientContext(
                    remoteAddress: try SocketAddress(ipAddress: "192.0.2.1", port: 40000),
                    scheme: .https,
                    identity: PeerIdentity(id: "id-laptop", name: "laptop")
                )
            )
            _ = client.connect(to: try SocketAddress(ipAddress: "127.0.0.1", port: 443))
        } catch {
            fatalError("the proxy pipeline could not be set up: \(error)")
        }
        _ = try? client.writeInbound(ByteBuffer(bytes: data))
        pump(loop, client: client, backends: backends)
        loop.advanceTime(by: .seconds(3600))
        pump(loop, client: client, backends: backends)
        client.close(promise: nil)
        pump(loop, client: client, backends: backends)
        _ = try? client.finish(acceptAlreadyClosed: true)
        for backend in backends.withLockedValue({ $0 }) { _ = try? backend.finish(acceptAlreadyClosed: true) }
        try? loop.syncShutdownGracefully()
    }

    /// Runs the loop and lets every backend answer what it was sent, until nothing moves.
    private static func pump(
        _ loop: EmbeddedEventLoop,
        client: EmbeddedChannel,
        backends: NIOLockedValueBox<[EmbeddedChannel]>
    ) {
        for _ in 0..<16 {
            loop.run()
            while (try? client.readOutbound(as: IOData.self)) != nil {}
            var answered = false
            for backend in backends.withLockedValue({ $0 }) where backend.isActive {
                var sent: [UInt8] = []
                while let part = try? backend.readOutbound(as: IOData.self) {
                    if case .byteBuffer(let bytes) = part { sent += bytes.readableBytesView }
                }
                if !sent.isEmpty {
                    _ = try? backend.writeInbound(answer(to: sent))
                    answered = true
                }
            }
            if !answered { return }
        }
    }
}
