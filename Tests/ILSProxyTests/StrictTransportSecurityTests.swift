import ILSCore
import ILSGateway
import ILSTesting
import NIOCore
import Testing

@Suite("Strict-Transport-Security in HTTP mode")
struct StrictTransportSecurityTests {
    @Test("with --hsts-max-age every TLS response carries the header, the gateway's own errors included")
    func headerOnEveryResponse() async throws {
        try await ProxyFixture.with(tls: true, configure: { $0.hstsMaxAge = .seconds(86400) }) { fixture in
            let connection = try await fixture.connect()
            try await connection.sendRequest("GET", "/health")
            let proxied = try await connection.readHead()
            #expect(proxied.status == 200)
            #expect(proxied.values("strict-transport-security") == ["max-age=86400"])
            _ = try await connection.readBody()
            // The gateway's own answer (a CONNECT it refuses) carries it too.
            try await connection.send("CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n")
            let own = try await connection.readHead()
            #expect(own.status == 405)
            #expect(own.values("strict-transport-security") == ["max-age=86400"])
            await connection.close()
        }
    }

    @Test("without the setting, and on plain HTTP whatever the setting, there is no header", arguments: [false, true])
    func noHeader(tls: Bool) async throws {
        try await ProxyFixture.with(tls: tls, configure: { if !tls { $0.hstsMaxAge = .seconds(60) } }) { fixture in
            let connection = try await fixture.connect()
            try await connection.sendRequest("GET", "/health")
            let head = try await connection.readHead()
            #expect(head.status == 200)
            #expect(head.header("strict-transport-security") == nil)
            await connection.close()
        }
    }

    @Test("a WebSocket upgrade still passes raw bytes both ways with the header on")
    func upgradeWithHeader() async throws {
        try await ProxyFixture.with(tls: true, configure: { $0.hstsMaxAge = .seconds(60) }) { fixture in
            let connection = try await fixture.connect()
            try await connection.sendRequest(
                "GET",
                "/ws",
                headers: [("Connection", "Upgrade"), ("Upgrade", "websocket"), ("Sec-WebSocket-Version", "13")]
            )
            let head = try await connection.readHead()
            #expect(head.status == 101)
            try await connection.send("ping 1\n")
            var received = ""
            while !received.contains("ping 1\n") {
                received += String(buffer: try await connection.readRaw())
            }
            #expect(received.hasPrefix("hello\n"))
            await connection.close()
        }
    }
}
