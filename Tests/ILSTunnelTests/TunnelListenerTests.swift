import Foundation
import ILSClient
import ILSCore
import ILSCrypto
import ILSTesting
import ILSTunnel
import Logging
import NIOCore
import NIOPosix
import Testing

/// The tunnel's listener on real sockets (127.0.0.1, port 0): who it lets listen where, and what a local client
/// hears and when its connection ends when a circuit cannot be opened.
@Suite("The tunnel's listener and its refusals", .clusterExclusive)
struct TunnelListenerTests {
    @Test("a tunnel refuses a non-loopback listen address unless remote clients are allowed")
    func loopbackOnly() async throws {
        let identity = try Self.identity(controllerPort: 1)
        for host in ["0.0.0.0", "192.0.2.1", "::"] {
            #expect(throws: ILSError.self) {
                try Tunnel(
                    identity: identity,
                    service: "claude-api",
                    listen: HostPort(host: host, port: 0),
                    allowRemote: false,
                    logger: Logger(label: "test")
                )
            }
        }
        let remote = try Tunnel(
            identity: identity,
            service: "claude-api",
            listen: HostPort(host: "0.0.0.0", port: 0),
            allowRemote: true,
            logger: Logger(label: "test")
        )
        #expect(try await remote.start().port != nil)
        await remote.shutdown()
    }

    @Test("with the controller unreachable a client is answered 502 controller_unreachable, then the tunnel hangs up")
    func controllerUnreachable() async throws {
        try await withUnreachableController { port in
            let connection = try await TestHTTPConnection(port: port)
            // The circuit is dialled when the first request has passed the tunnel's checks.
            try await connection.sendRequest("GET", "/health")
            let head = try await connection.readHead()
            #expect(head.status == 502)
            #expect(head.header("Content-Type") == "application/json")
            let body = try JSONDecoder().decode(
                [String: String].self,
                from: Data(String(buffer: try await connection.readBody()).utf8)
            )
            #expect(body["code"] == "controller_unreachable")
            #expect(body["error"]?.contains("cannot reach the controller") == true)
            #expect(await connection.isClosedByPeer())
        }
    }

    @Test(
        "a web page's request is refused before any circuit is dialled (an unreachable controller would be 502)",
        arguments: [
            ("Host: evil.example\r\n", 421, "misdirected_request"),
            ("Host: 127.0.0.1\r\nOrigin: https://evil.example\r\n", 403, "cross_site_request"),
            ("Host: 127.0.0.1\r\nSec-Fetch-Site: cross-site\r\n", 403, "cross_site_request"),
            ("Host: 127.0.0.1\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n", 400, "ambiguous_framing"),
        ]
    )
    func webPageRefusedBeforeDialling(fields: String, status: Int, code: String) async throws {
        try await withUnreachableController { port in
            let connection = try await TestHTTPConnection(port: port)
            try await connection.send("POST /claude/run HTTP/1.1\r\n\(fields)\r\n")
            let head = try await connection.readHead()
            #expect(head.status == status)
            let body = try JSONDecoder().decode(
                [String: String].self,
                from: Data(String(buffer: try await connection.readBody()).utf8)
            )
            #expect(body["code"] == code)
            #expect(await connection.isClosedByPeer())
        }
    }

    @Test("a refused client that never hangs up is closed by the tunnel after the answer")
    func refusedClientIsClosed() async throws {
        try await withUnreachableController { port in
            let client = try await HalfOpenClient.connect(port: port)
            client.channel.writeAndFlush(ByteBuffer(string: "GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"), promise: nil)
            // The answer, then the end of the tunnel's output (a half-close: the client may still be sending).
            try await client.answered.futureResult.get()
            #expect(String(buffer: client.received.withLockedValue { $0 }).hasPrefix("HTTP/1.1 502 Bad Gateway\r\n"))
            // The client keeps its side open and keeps talking; the tunnel drops what it sends and, once it has waited
            // long enough for a hang-up, closes: a write then meets a reset and the connection ends.
            let clock = ContinuousClock()
            let deadline = clock.now + TestTiming.scaled(.seconds(15))
            while client.channel.isActive, clock.now < deadline {
                client.channel.writeAndFlush(ByteBuffer(string: "more"), promise: nil)
                try await Task.sleep(for: .milliseconds(100))
            }
            #expect(!client.channel.isActive)
            try? await client.channel.close()
        }
    }

    @Test("a circuit the controller refuses is answered with the controller's code: unknown service is 404")
    func controllerRefusal() async throws {
        let cluster = try await TestCluster.start(gateways: 0)
        do {
            let tunnel = try Tunnel(
                identity: try await cluster.enroll("laptop", role: .device),
                service: "no-such-service",
                listen: HostPort(host: "127.0.0.1", port: 0),
                allowRemote: false,
                logger: Logger(label: "test")
            )
            let port = try #require(try await tunnel.start().port)
            let connection = try await TestHTTPConnection(port: port)
            try await connection.sendRequest("GET", "/health")
            #expect(try await connection.readHead().status == 404)
            let body = try JSONDecoder().decode(
                [String: String].self,
                from: Data(String(buffer: try await connection.readBody()).utf8)
            )
            #expect(body["code"] == "unknown_service")
            await tunnel.shutdown()
        } catch {
            await cluster.stop()
            throw error
        }
        await cluster.stop()
    }

    @Test("a tunnel that renews its certificate keeps working with the new one; the old one is refused")
    func renewal() async throws {
        let cluster = try await TestCluster.start()
        do {
            let path = "\(cluster.directory)/identities/ipad.json"
            let before = try #require(try await cluster.state.store.identity(named: "ipad")?.certificateFingerprint)
            // A live controller connection made with the old certificate exists before the renewal.
            let first = try await TestHTTPConnection(port: cluster.tunnelPort)
            try await first.sendRequest("GET", "/health")
            #expect(try await first.readHead().status == 200)
            _ = try await first.readBody()
            try await #require(cluster.tunnel).renewNow(path: path)
            let after = try #require(try await cluster.state.store.identity(named: "ipad")?.certificateFingerprint)
            #expect(after != before)
            let connection = try await TestHTTPConnection(port: cluster.tunnelPort)
            try await connection.sendRequest("GET", "/health")
            #expect(try await connection.readHead().status == 200)
            await connection.close()
        } catch {
            await cluster.stop()
            throw error
        }
        await cluster.stop()
    }

    /// Runs `body` with a tunnel on a free loopback port whose controller address has nothing listening on it.
    private func withUnreachableController(_ body: (Int) async throws -> Void) async throws {
        let tunnel = try Tunnel(
            identity: try Self.identity(controllerPort: try await Self.closedPort()),
            service: "claude-api",
            listen: HostPort(host: "127.0.0.1", port: 0),
            allowRemote: false,
            logger: Logger(label: "test")
        )
        let port = try #require(try await tunnel.start().port)
        do {
            try await body(port)
        } catch {
            await tunnel.shutdown()
            throw error
        }
        await tunnel.shutdown()
    }

    /// A device identity issued by a throwaway CA, naming a controller on `controllerPort` of 127.0.0.1.
    private static func identity(controllerPort: Int) throws -> IdentityFile {
        let authority = try CertificateAuthority.create(name: "tunnel-tests")
        let (certificate, key) = try TestIdentities.issue(authority, name: "ipad", role: .device)
        return IdentityFile(
            controller: "https://127.0.0.1:\(controllerPort)",
            identity: IdentityRecord(
                id: "id-ipad",
                name: "ipad",
                role: .device,
                attributes: [],
                state: .active,
                createdAt: 0
            ),
            certificate: certificate,
            caCertificate: authority.certificatePEM,
            privateKey: key.privateKeyPEM
        )
    }

    /// A port that was just bound and released: connecting to it is refused.
    private static func closedPort() async throws -> Int {
        let listener = try await ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .bind(host: "127.0.0.1", port: 0).get()
        let port = try #require(listener.localAddress?.port)
        try await listener.close()
        return port
    }
}
