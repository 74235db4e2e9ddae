import NIOCore
import NIOEmbedded

extension EmbeddedChannel {
    /// Connects, hands `bytes` to the pipeline as one read, lets it run and answer (answers are dropped), then closes
    /// and tears the channel down, whatever the pipeline made of the input.
    func serve(_ bytes: UnsafeRawBufferPointer) {
        _ = connect(to: try! SocketAddress(ipAddress: "192.0.2.1", port: 40000))
        _ = try? writeInbound(ByteBuffer(bytes: bytes))
        embeddedEventLoop.run()
        while (try? readOutbound(as: IOData.self)) != nil {}
        close(promise: nil)
        embeddedEventLoop.run()
        _ = try? finish(acceptAlreadyClosed: true)
    }
}
