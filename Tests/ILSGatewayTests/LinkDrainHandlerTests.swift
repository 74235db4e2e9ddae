import ILSFabric
import ILSTesting
import NIOCore
import NIOEmbedded
import NIOHPACK
import NIOHTTP2
import Testing

@testable import ILSGateway

/// `LinkDrainHandler` on a real HTTP/2 link between two embedded channels: the controller's end opens the control
/// stream and circuits, the gateway's end drains.
@Suite("A renewed gateway's old link finishes its circuits, then closes")
struct LinkDrainHandlerTests {
    struct Link {
        let loop = EmbeddedEventLoop()
        let gatewaySide: EmbeddedChannel
        let controllerSide: EmbeddedChannel
        let multiplexer: NIOHTTP2Handler.StreamMultiplexer

        init() throws {
            gatewaySide = EmbeddedChannel(loop: loop)
            controllerSide = EmbeddedChannel(loop: loop)
            let drain = LinkDrainHandler()
            try gatewaySide.pipeline.syncOperations.configureFabricHTTP2(mode: .server, streamDelegate: drain) {
                FrameRecorder { _ in }
            }
            try gatewaySide.pipeline.syncOperations.addHandler(drain)
            multiplexer = try controllerSide.pipeline.syncOperations.configureFabricHTTP2(mode: .client)
            let address = try SocketAddress(ipAddress: "127.0.0.1", port: 1)
            gatewaySide.connect(to: address, promise: nil)
            controllerSide.connect(to: address, promise: nil)
            loop.run()
        }

        /// A stream from the controller's end, with its head sent and seen by the gateway's end.
        func open(_ path: String) throws -> any Channel {
            let stream = multiplexer.createStreamChannel { stream in
                stream.eventLoop.makeSucceededVoidFuture()
            }
            loop.run()
            let channel = try stream.wait()
            let head = HPACKHeaders([
                (":method", "GET"), (":scheme", "https"), (":authority", "claude-api"), (":path", path),
            ])
            channel.writeAndFlush(HTTP2Frame.FramePayload.headers(.init(headers: head)), promise: nil)
            try exchangeBytes(controllerSide, gatewaySide)
            return channel
        }

        func drain() throws {
            gatewaySide.pipeline.triggerUserOutboundEvent(LinkDrainHandler.Drain(), promise: nil)
            try exchangeBytes(controllerSide, gatewaySide)
        }

        func finish() {
            _ = try? gatewaySide.finish()
            _ = try? controllerSide.finish()
        }
    }

    @Test("a draining link with a live circuit stays open until the circuit ends")
    func liveCircuitKeepsTheLink() throws {
        let link = try Link()
        _ = try link.open("/ils/v1/host")
        let circuit = try link.open("/circuit")
        try link.drain()
        #expect(link.gatewaySide.isActive, "the link closed with a live circuit on it")
        circuit.close(promise: nil)
        link.loop.run()
        try exchangeBytes(link.controllerSide, link.gatewaySide)
        #expect(!link.gatewaySide.isActive, "the link stayed open after its last circuit ended")
        link.finish()
    }

    @Test("a draining link with only its control stream closes at once")
    func idleLinkCloses() throws {
        let link = try Link()
        _ = try link.open("/ils/v1/host")
        try link.drain()
        #expect(!link.gatewaySide.isActive)
        link.finish()
    }
}
