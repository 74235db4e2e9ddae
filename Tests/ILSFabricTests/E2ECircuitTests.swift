import Foundation
import ILSCore
import ILSCrypto
import ILSFabric
import ILSProxy
import ILSTesting
import Logging
import NIOCore
import NIOPosix
import Testing

/// A gateway end of a circuit on a loopback TCP port: framing, the responder, then the proxy core in front of a
/// `TestBackend`. (The relay and multiplexing come later; the bytes between the two ends are what a relay would see.)
struct CircuitFixture {
    let backend: TestBackend
    let listener: any Channel
    let authority: CertificateAuthority
    let device: E2EHandshake.Credentials

    var port: Int { listener.localAddress!.port! }

    static func with(_ body: (CircuitFixture) async throws -> Void) async throws {
        let backend = try await TestBackend.start()
        let authority = try CertificateAuthority.create(name: "test CA")
        let gateway = try credentials(authority, name: "gw", role: .gateway)
        let device = try credentials(authority, name: "ipad", role: .device)
        let core = ProxyCore(
            configuration: ProxyConfiguration(backend: BackendURL(host: "127.0.0.1", port: backend.port)),
            logger: Logger(label: "test", factory: { _ in SwiftLogNoOpLogHandler() })
        )
        let listener = try await ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .childChannelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    let pipeline = channel.pipeline.syncOperations
                    try pipeline.addHandler(ByteToMessageHandler(FrameDecoder()))
                    try pipeline.addHandler(
                        E2EResponderHandler(
                            credentials: gateway,
                            authorize: { peer, service in
                                guard service == "claude-api" else { return .deny(reason: "no such service") }
                                guard peer.role == .device else {
                                    return .deny(reason: "identity \(peer.name) may not dial \(service)")
                                }
                                return .allow
                            },
                            onEstablished: { channel, event in
                                try core.configureClientPipeline(
                                    channel.pipeline.syncOperations,
                                    client: ClientContext(remoteAddress: nil, scheme: .https, identity: event.peer)
                                )
                            }
                        )
                    )
                }
            }
            .bind(host: "127.0.0.1", port: 0).get()
        let fixture = CircuitFixture(backend: backend, listener: listener, authority: authority, device: device)
        do {
            try await body(fixture)
        } catch {
            try? await listener.close()
            await backend.stop()
            throw error
        }
        try? await listener.close()
        await backend.stop()
    }

    static func credentials(_ authority: CertificateAuthority, name: String, role: IdentityRole) throws
        -> E2EHandshake.Credentials
    {
        try TestIdentities.credentials(authority, name: name, role: role)
    }

    /// A raw HTTP connection whose bytes travel end-to-end encrypted, optionally through `tamper`.
    func connect(
        as credentials: E2EHandshake.Credentials? = nil,
        service: String = "claude-api",
        tamper: (any ChannelHandler & Sendable)? = nil
    ) async throws -> TestHTTPConnection {
        let credentials = credentials ?? device
        return try await TestHTTPConnection(port: port) { pipeline in
            if let tamper { try pipeline.addHandler(tamper) }
            try pipeline.addHandler(ByteToMessageHandler(FrameDecoder()))
            try pipeline.addHandler(E2EInitiatorHandler(credentials: credentials, service: service))
        }
    }
}

@Suite("End-to-end encrypted circuits into the proxy core")
struct E2ECircuitTests {
    @Test("SSE streams event by event through an encrypted circuit, and the backend learns the device's identity")
    func sseThroughCircuit() async throws {
        try await CircuitFixture.with { fixture in
            let connection = try await fixture.connect()
            try await connection.sendRequest("GET", "/sse?n=20&interval_ms=\(TestTiming.scaled(milliseconds: 100))")
            #expect(try await connection.readHead().status == 200)
            let first = try #require(try await connection.readBodyPart())
            #expect(String(buffer: first).contains("\"index\": 0"))
            #expect(fixture.backend.record.eventsSent < 20)
            _ = try await connection.drainBody()

            try await connection.sendRequest("GET", "/headers", headers: [("X-ILS-Identity", "mallory")])
            #expect(try await connection.readHead().status == 200)
            let lines = String(buffer: try await connection.readBody()).split(separator: "\n").map(String.init)
            #expect(lines.contains("x-ils-identity: ipad"))
            #expect(lines.contains("x-ils-identity-id: id-ipad"))
            #expect(!lines.contains("x-ils-identity: mallory"))
            await connection.close()
        }
    }

    @Test("a large body crosses the circuit intact in multi-record pieces")
    func largeUpload() async throws {
        try await CircuitFixture.with { fixture in
            let connection = try await fixture.connect()
            let payload = TestBackend.pattern(size: 3 * 1024 * 1024 + 17)
            try await connection.sendRequest("POST", "/upload", body: ByteBuffer(bytes: payload))
            #expect(try await connection.readHead().status == 200)
            #expect(String(buffer: try await connection.readBody()).hasPrefix("{\"bytes\":\(payload.count),"))
            await connection.close()
        }
    }

    @Test("a gateway identity may not dial: refused with a reason, and the backend never hears of it")
    func gatewayCannotDial() async throws {
        try await CircuitFixture.with { fixture in
            let impostor = try CircuitFixture.credentials(fixture.authority, name: "gw2", role: .gateway)
            let connection = try await fixture.connect(as: impostor)
            // The refusal may close the circuit before the request is even written; reading then reports why.
            try? await connection.sendRequest("GET", "/health")
            do {
                _ = try await connection.readHead()
                Issue.record("a gateway identity got an answer")
            } catch let refused as E2EInitiatorHandler.Refused {
                #expect(refused.reason.contains("may not dial"))
            }
            #expect(fixture.backend.record.connectionsAccepted == 0)
        }
    }

    @Test("a relay that alters a record makes the circuit fail closed before the request reaches the backend")
    func tamperedRecordFailsClosed() async throws {
        try await CircuitFixture.with { fixture in
            let connection = try await fixture.connect(tamper: FlipByteInWrite(index: 2))
            try await connection.sendRequest("GET", "/health")
            #expect(await connection.isClosedByPeer())
            #expect(fixture.backend.record.connectionsAccepted == 0)
        }
    }
}

/// Plays a malicious relay on the device's side of the wire: flips one bit in the Nth outgoing write (0: hello,
/// 1: finished, 2: the first record).
final class FlipByteInWrite: ChannelOutboundHandler, @unchecked Sendable {
    typealias OutboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer
    private let index: Int
    private var seen = 0

    init(index: Int) { self.index = index }

    func write(context: ChannelHandlerContext, data: NIOAny, promise: EventLoopPromise<Void>?) {
        var buffer = unwrapOutboundIn(data)
        if seen == index, buffer.readableBytes > 8 {
            let at = buffer.readerIndex + buffer.readableBytes - 3
            buffer.setInteger(buffer.getInteger(at: at, as: UInt8.self)! ^ 0x01, at: at)
        }
        seen += 1
        context.write(wrapOutboundOut(buffer), promise: promise)
    }
}
