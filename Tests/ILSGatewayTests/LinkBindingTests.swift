import Foundation
import ILSCore
import ILSCrypto
import ILSFabric
import ILSProxy
import ILSTesting
import Logging
import NIOCore
import NIOEmbedded
import NIOHPACK
import NIOHTTP2
import Testing

@testable import ILSGateway

@Suite("A gateway link's first circuits and its binding")
struct LinkBindingTests {
    /// What the controller's end of one link saw.
    final class Answers: @unchecked Sendable {
        var control: [HTTP2Frame.FramePayload] = []
        var circuit: [HTTP2Frame.FramePayload] = []
    }

    /// Plays the controller: opens the control stream, then puts the binding answer and a circuit's `CONNECT` into
    /// one read of the gateway's side (a fast controller's writes arrive together). Returns what the circuit got.
    func run(dropLink: Bool) throws -> (circuit: [HTTP2Frame.FramePayload], gatewayOpen: Bool) {
        let authority = try CertificateAuthority.create(name: "test CA")
        let loop = EmbeddedEventLoop()
        let gatewaySide = EmbeddedChannel(loop: loop)
        let controllerSide = EmbeddedChannel(loop: loop)
        var settings = GatewayStreamRouter.Context(
            service: "claude-api",
            credentials: try TestIdentities.credentials(authority, name: "gw", role: .gateway),
            policy: GatewayPolicy(),
            core: ProxyCore(
                configuration: ProxyConfiguration(backend: BackendURL(host: "127.0.0.1", port: 9)),
                logger: Logger(label: "test", factory: { _ in SwiftLogNoOpLogHandler() }),
                loopCount: 1
            ),
            logger: Logger(label: "test", factory: { _ in SwiftLogNoOpLogHandler() }),
            onRefusal: { _, _, _ in }
        )
        // A second link on a controller loop another link covers is dropped at once, as `OverlayGateway` does.
        settings.onBound = { connection, _, _ in if dropLink { connection.close(promise: nil) } }
        settings.binding = LinkBinding(eventLoop: loop)
        let router = settings
        try gatewaySide.pipeline.syncOperations.configureFabricHTTP2(mode: .server) { GatewayStreamRouter(router) }
        let multiplexer = try controllerSide.pipeline.syncOperations.configureFabricHTTP2(mode: .client)
        let address = try SocketAddress(ipAddress: "127.0.0.1", port: 1)
        gatewaySide.connect(to: address, promise: nil)
        controllerSide.connect(to: address, promise: nil)
        loop.run()

        // An embedded loop runs only when told: run it, then the future is complete (or never will be).
        func opened(_ future: EventLoopFuture<any Channel>) throws -> any Channel {
            loop.run()
            var result: Result<any Channel, any Error>?
            future.whenComplete { result = $0 }
            loop.run()
            guard let result else { throw ChannelError.inappropriateOperationForState }
            return try result.get()
        }

        let answers = Answers()
        let control = try opened(
            multiplexer.createStreamChannel { stream in
                stream.eventLoop.makeCompletedFuture {
                    try stream.pipeline.syncOperations.addHandler(FrameRecorder { answers.control.append($0) })
                }
            }
        )
        control.writeAndFlush(
            HTTP2Frame.FramePayload.headers(
                .init(headers: [
                    ":method": "GET", ":scheme": "https", ":authority": "controller",
                    ":path": FabricProtocol.controlPath,
                ])
            ),
            promise: nil
        )
        try exchangeBytes(controllerSide, gatewaySide)
        #expect(answers.control.count == 1, "the gateway answers the control stream")

        // The binding answer, then a circuit, flushed together and carried to the gateway in one read.
        var message = try JSONEncoder().encode(HostControlMessage(dialRoles: [.device], relayLoop: 0, relayLoops: 2))
        message.append(UInt8(ascii: "\n"))
        control.write(
            HTTP2Frame.FramePayload.data(.init(data: .byteBuffer(ByteBuffer(bytes: message)))),
            promise: nil
        )
        let circuit = try opened(
            multiplexer.createStreamChannel { stream in
                stream.eventLoop.makeCompletedFuture {
                    try stream.pipeline.syncOperations.addHandler(FrameRecorder { answers.circuit.append($0) })
                }
            }
        )
        circuit.write(
            HTTP2Frame.FramePayload.headers(.init(headers: [":method": "CONNECT", ":authority": "claude-api"])),
            promise: nil
        )
        control.flush()
        circuit.flush()
        try exchangeBytes(controllerSide, gatewaySide)
        let open = gatewaySide.isActive
        _ = try? gatewaySide.finish()
        _ = try? controllerSide.finish()
        return (answers.circuit, open)
    }

    @Test("a circuit that arrives in the same read as the binding answer is answered only after it is applied")
    func waitsForTheBinding() throws {
        let (circuit, open) = try run(dropLink: false)
        #expect(open)
        guard case .headers(let answer) = circuit.first else {
            Issue.record("the circuit was not answered: \(circuit)")
            return
        }
        #expect(answer.headers.first(name: ":status") == "200")
    }

    /// Without the wait, swift-nio-http2 hands the new stream its head before the control stream its data: the
    /// circuit was accepted (200) and then died with the dropped link, after the device had been told it was open.
    @Test("a link the binding answer drops accepts no circuit that arrived with the answer")
    func droppedLinkAcceptsNothing() throws {
        let (circuit, open) = try run(dropLink: true)
        #expect(!open)
        #expect(
            !circuit.contains { payload in
                if case .headers(let answer) = payload { answer.headers.first(name: ":status") == "200" } else { false }
            }
        )
    }
}
