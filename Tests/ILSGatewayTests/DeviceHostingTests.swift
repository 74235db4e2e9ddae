import Foundation
import ILSCore
import ILSFabric
import ILSTesting
import NIOConcurrencyHelpers
import NIOCore
import NIOHPACK
import NIOHTTP2
import NIOPosix
import Testing

@Suite("Identities hosting what their role may not host", .clusterExclusive)
struct DeviceHostingTests {
    @Test("a device identity that connects as a gateway anyway is refused the binding and disconnected")
    func deviceCannotHost() async throws {
        let cluster = try await TestCluster.start(gateways: 1)
        do {
            // OverlayGateway and the CLI both refuse a device identity before dialling; this plays a modified
            // gateway that does not, so the controller's own bind check is what is tested.
            let device = try await cluster.enroll("dev-host", role: .device)
            let answer = NIOLockedValueBox("")
            let connector = try FabricConnector(identity: device, alpn: FabricProtocol.hostALPN)
            let channel = try await connector.connect(on: MultiThreadedEventLoopGroup.singleton.next()) { channel in
                try channel.pipeline.syncOperations.configureFabricHTTP2(mode: .server) { ClaimsToHost(answer: answer) }
            }.get()
            let closed = try await withThrowingTaskGroup(of: Bool.self) { group in
                group.addTask {
                    try await channel.closeFuture.get()
                    return true
                }
                group.addTask {
                    try await Task.sleep(for: .seconds(20))
                    return false
                }
                let first = try await group.next()!
                group.cancelAll()
                return first
            }
            #expect(closed, "the controller kept a device's hosting connection open")
            let said = answer.withLockedValue { $0 }
            #expect(said.contains("\"error\""), "controller answered: \(said)")
            #expect(said.contains("may not host"), "controller answered: \(said)")
            #expect(!said.contains("dialRoles"))

            // The real gateway still carries every circuit.
            let tablet = try await cluster.enroll("tablet", role: .device)
            let port = try await cluster.startTunnel(identity: tablet)
            let connection = try await TestHTTPConnection(port: port)
            try await connection.sendRequest("GET", "/health")
            #expect(try await connection.readHead().status == 200)
            #expect(String(buffer: try await connection.readBody()) == "ok")
            await connection.close()
        } catch {
            await cluster.stop()
            throw error
        }
        await cluster.stop()
    }
}

/// Answers the controller's control stream as a gateway would, claiming `claude-api`, and keeps what the
/// controller sends back.
private final class ClaimsToHost: ChannelInboundHandler, Sendable {
    typealias InboundIn = HTTP2Frame.FramePayload
    typealias OutboundOut = HTTP2Frame.FramePayload

    let answer: NIOLockedValueBox<String>

    init(answer: NIOLockedValueBox<String>) { self.answer = answer }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        switch unwrapInboundIn(data) {
        case .headers:
            let headers = HPACKHeaders([(":status", "200"), (FabricProtocol.serviceHeader, "claude-api")])
            context.writeAndFlush(wrapOutboundOut(.headers(.init(headers: headers))), promise: nil)
        case .data(let data):
            if case .byteBuffer(let buffer) = data.data {
                answer.withLockedValue { $0 += String(buffer: buffer) }
            }
        default:
            break
        }
    }
}
