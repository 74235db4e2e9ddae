import ILSCore
import ILSProxy
import Logging
import NIOConcurrencyHelpers
import NIOCore
import NIOEmbedded
import Testing

/// The proxy's real client pipeline on an embedded event loop, with each backend connection an embedded channel on
/// the same loop: the order of work and the loop's clock are the test's to set (`loop.run()`, `loop.advanceTime`),
/// for what a loaded machine makes a matter of luck on real sockets.
struct EmbeddedProxy {
    let loop: EmbeddedEventLoop
    let client: EmbeddedChannel
    let backends: NIOLockedValueBox<[EmbeddedChannel]>

    var backend: EmbeddedChannel { backends.withLockedValue { $0[0] } }

    /// A client connection, accepted now by the loop's clock. `clientHandler`, if any, sits at its socket end.
    static func make(
        clientHandler: (any ChannelHandler)? = nil,
        configure: (inout ProxyConfiguration) -> Void = { _ in }
    ) throws -> EmbeddedProxy {
        let loop = EmbeddedEventLoop()
        let backends = NIOLockedValueBox<[EmbeddedChannel]>([])
        var configuration = ProxyConfiguration(backend: BackendURL(host: "127.0.0.1", port: 8000))
        configure(&configuration)
        let pools = BackendPool(configuration: configuration, loopCount: 1) { _, _, initialize in
            let backend = EmbeddedChannel(loop: loop)
            backends.withLockedValue { $0.append(backend) }
            return initialize(backend).flatMap {
                backend.connect(to: try! SocketAddress(ipAddress: "127.0.0.1", port: 8000))
            }.map { backend }
        }
        let core = ProxyCore(
            configuration: configuration,
            logger: .init(label: "test", factory: { _ in SwiftLogNoOpLogHandler() }),
            pools: pools
        )
        let client = EmbeddedChannel(loop: loop)
        if let clientHandler { try client.pipeline.syncOperations.addHandler(clientHandler) }
        try core.configureClientPipeline(
            client.pipeline.syncOperations,
            client: ClientContext(
                remoteAddress: try SocketAddress(ipAddress: "192.0.2.1", port: 40000),
                scheme: .https,
                identity: PeerIdentity(id: "id-laptop", name: "laptop")
            )
        )
        _ = client.connect(to: try SocketAddress(ipAddress: "127.0.0.1", port: 443))
        return EmbeddedProxy(loop: loop, client: client, backends: backends)
    }

    /// Sends `request` from the client and lets the newest backend connection answer it with `answer`, in one read.
    /// Returns what that backend connection was sent.
    @discardableResult
    func exchange(_ request: ByteBuffer, answer: String) throws -> String {
        try client.writeInbound(request)
        loop.run()
        let backend = try #require(backends.withLockedValue { $0.last })
        let sent = String(decoding: try Self.drain(backend), as: UTF8.self)
        try backend.writeInbound(ByteBuffer(string: answer))
        loop.run()
        return sent
    }

    /// Everything flushed on `channel` so far.
    static func drain(_ channel: EmbeddedChannel) throws -> [UInt8] {
        var bytes: [UInt8] = []
        while let part = try channel.readOutbound(as: IOData.self) {
            if case .byteBuffer(let buffer) = part { bytes += buffer.readableBytesView }
        }
        return bytes
    }

    func finish() throws {
        _ = try client.finish(acceptAlreadyClosed: true)
        for backend in backends.withLockedValue({ $0 }) { _ = try backend.finish(acceptAlreadyClosed: true) }
        try loop.syncShutdownGracefully()
    }
}
