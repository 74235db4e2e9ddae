import ILSCore
import ILSObservability
import ILSTesting
import Logging
import Metrics
import NIOCore
import Testing

@Suite("Metrics listener")
struct MetricsServerTests {
    let logger = Logger(label: "test", factory: { _ in SwiftLogNoOpLogHandler() })

    @Test("serves Prometheus text, liveness and readiness on loopback")
    func serves() async throws {
        let ready = ReadyFlag()
        let server = try MetricsServer(
            listen: HostPort(host: "127.0.0.1", port: 0),
            allowRemote: false,
            logger: logger,
            ready: { ready.value }
        )
        let port = try await server.start().port!
        Counter(label: "ils_test_events_total").increment(by: 3)

        let metrics = try await TestHTTPConnection(port: port)
        try await metrics.sendRequest("GET", "/metrics")
        #expect(try await metrics.readHead().status == 200)
        #expect(String(buffer: try await metrics.readBody()).contains("ils_test_events_total 3"))

        try await metrics.sendRequest("GET", "/healthz")
        #expect(try await metrics.readHead().status == 200)
        _ = try await metrics.readBody()
        try await metrics.sendRequest("GET", "/readyz")
        #expect(try await metrics.readHead().status == 503)
        _ = try await metrics.readBody()
        ready.value = true
        try await metrics.sendRequest("GET", "/readyz")
        #expect(try await metrics.readHead().status == 200)
        await metrics.close()
    }

    @Test("refuses a non-loopback address unless allowed")
    func loopbackOnly() {
        #expect(throws: ILSError.self) {
            _ = try MetricsServer(
                listen: HostPort(host: "0.0.0.0", port: 0),
                allowRemote: false,
                logger: logger,
                ready: { true }
            )
        }
    }
}

final class ReadyFlag: @unchecked Sendable {
    var value = false
}
