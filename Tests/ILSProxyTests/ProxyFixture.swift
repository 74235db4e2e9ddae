import ILSCore
import ILSGateway
import ILSProxy
import ILSTesting
import Logging
import NIOCore

/// A gateway in HTTP mode in front of a `TestBackend`, both on 127.0.0.1 port 0.
struct ProxyFixture {
    let backend: TestBackend
    let gateway: HTTPModeServer
    let gatewayPort: Int
    let pki: TestPKI?

    static let quietLogger = Logger(label: "test", factory: { _ in SwiftLogNoOpLogHandler() })

    /// Runs `body` with a fresh backend and gateway and always stops both.
    static func with<T>(
        tls: Bool = false,
        configure: (inout HTTPModeConfiguration) -> Void = { _ in },
        _ body: (ProxyFixture) async throws -> T
    ) async throws -> T {
        let backend = try await TestBackend.start()
        let pki = tls ? try TestPKI() : nil
        var configuration = HTTPModeConfiguration(
            listen: HostPort(host: "127.0.0.1", port: 0),
            tls: pki.map { .init(certificateChain: $0.serverCertificatePath, privateKey: $0.serverKeyPath) },
            proxy: ProxyConfiguration(backend: BackendURL(host: "127.0.0.1", port: backend.port))
        )
        configuration.drainTimeout = .seconds(5)
        configuration.proxy.backendIdleTimeout = TestTiming.scaled(configuration.proxy.backendIdleTimeout)
        configure(&configuration)
        // Access lines are written at info: a test that takes them needs a logger at that level.
        let logger =
            configuration.proxy.accessLog == nil
            ? quietLogger : Logger(label: "test", factory: { _ in AccessLogTests.Events() })
        let gateway = try HTTPModeServer(configuration: configuration, logger: logger)
        let address = try await gateway.start()
        let fixture = ProxyFixture(backend: backend, gateway: gateway, gatewayPort: address.port!, pki: pki)
        do {
            let result = try await body(fixture)
            await fixture.stop()
            return result
        } catch {
            await fixture.stop()
            throw error
        }
    }

    func stop() async {
        await gateway.shutdown()
        await backend.stop()
        pki?.remove()
    }

    func connect(firstBytes: String? = nil) async throws -> TestHTTPConnection {
        try await TestHTTPConnection(port: gatewayPort, trustRootPEM: pki?.caCertificatePEM, firstBytes: firstBytes)
    }
}

/// Polls `condition` until it holds or `limit` passes (by default `TestTiming.hangGuard`); returns whether it held.
func eventually(within limit: Duration = TestTiming.hangGuard, _ condition: () -> Bool) async -> Bool {
    await TestCluster.eventually(limit, condition)
}
