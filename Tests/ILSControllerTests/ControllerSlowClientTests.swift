import Foundation
import ILSClient
import ILSController
import ILSCore
import ILSFabric
import ILSTesting
import Logging
import NIOConcurrencyHelpers
import NIOCore
import Testing

/// Slowloris on the controller's API, and the connection caps, over real TLS on 127.0.0.1.
@Suite("The controller's API against clients that trickle, and its connection caps")
struct ControllerSlowClientTests {
    /// Deadlines short enough for a test, long enough for a loaded machine to send a whole request well within them.
    static let timeouts = APIRequestDeadlines.Timeouts(
        head: TestTiming.scaled(.seconds(2)),
        body: TestTiming.scaled(.seconds(2)),
        idle: TestTiming.scaled(.seconds(30))
    )
    /// One trickled piece every half second, for far longer than any deadline: under a read timeout that every byte
    /// resets (the controller before fixed deadlines) the connection would stay open for all of it.
    static let trickleInterval = Duration.milliseconds(500) * Int(TestTiming.scale)
    static let tricklePieces = 40

    @Test("a request head trickled a header line at a time is answered 408 at its deadline, not kept open")
    func trickledHeadIsCut() async throws {
        try await ControllerFixture.with { fixture in
            let server = try Self.server(fixture)
            let port = try #require(try await server.start().port)
            defer { Task { await server.shutdown() } }
            let connection = try await TestHTTPConnection(
                port: port,
                trustRootPEM: fixture.state.authority.certificatePEM
            )
            try await connection.send("GET /v1/enroll/info HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            let outcome = try await Self.trickle(on: connection) { "X-Trickle-\($0): x\r\n" }
            #expect(outcome.piecesSent < Self.tricklePieces, "the trickle ran its whole course")
            #expect(outcome.answer.hasPrefix("HTTP/1.1 408 "), "answer: \(outcome.answer)")
            #expect(outcome.answer.contains(#""code":"request_timeout""#))
            try await Self.expectServes(port: port, fixture: fixture)
        }
    }

    @Test("an enrollment body trickled a byte at a time is answered 408 at its deadline and spends no token")
    func trickledBodyIsCut() async throws {
        try await ControllerFixture.with { fixture in
            let token = try await fixture.token(for: "trickle-device")
            let server = try Self.server(fixture)
            let port = try #require(try await server.start().port)
            defer { Task { await server.shutdown() } }
            let connection = try await TestHTTPConnection(
                port: port,
                trustRootPEM: fixture.state.authority.certificatePEM
            )
            try await connection.send(
                "POST /v1/enroll HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                    + "Content-Length: 4000\r\n\r\n{\"token\":\"\(token)\""
            )
            let outcome = try await Self.trickle(on: connection) { _ in " " }
            #expect(outcome.piecesSent < Self.tricklePieces, "the trickle ran its whole course")
            #expect(outcome.answer.hasPrefix("HTTP/1.1 408 "), "answer: \(outcome.answer)")
            // Nothing was written: the token is unspent and still enrolls.
            #expect(try await fixture.controller.identity(named: "trickle-device").state == .pending)
            _ = try await Enrollment.enroll(token: token, outputPath: fixture.path("trickle.json"), force: false)
        }
    }

    @Test("a keep-alive request whose first byte comes after the head timeout is served: its deadline starts there")
    func headDeadlineStartsAtFirstByte() async throws {
        try await ControllerFixture.with { fixture in
            let server = try Self.server(fixture)
            let port = try #require(try await server.start().port)
            defer { Task { await server.shutdown() } }
            let connection = try await TestHTTPConnection(
                port: port,
                trustRootPEM: fixture.state.authority.certificatePEM
            )
            for round in 0..<2 {
                // Sleep: the idle gap before the second request must outlast the head timeout; that gap is the test.
                if round == 1 { try await Task.sleep(for: .nanoseconds(Self.timeouts.head.nanoseconds * 3 / 2)) }
                try await connection.sendRequest("GET", "/v1/enroll/info")
                let head = try await connection.readHead()
                #expect(head.status == 200)
                _ = try await connection.drainBody()
            }
            await connection.close()
        }
    }

    @Test("beyond the per-source cap a connection is closed at accept, logged once, and a good client is served later")
    func perSourceCap() async throws {
        try await Self.capRefuses(limits: .init(total: 100, perSource: 3), cap: "per_source")
    }

    @Test("beyond the total cap a connection is closed at accept, and a good client is served once one closes")
    func totalCap() async throws {
        try await Self.capRefuses(limits: .init(total: 3, perSource: 100), cap: "total")
    }

    // Helpers

    static func server(
        _ fixture: ControllerFixture,
        limits: ConnectionLimiter.Limits = ControllerServer.defaultConnectionLimits,
        logger: Logger = Logger(label: "test", factory: { _ in SwiftLogNoOpLogHandler() })
    ) throws -> ControllerServer {
        try ControllerServer(
            state: fixture.state,
            listen: HostPort(host: "127.0.0.1", port: 0),
            logger: logger,
            // Connections that send nothing are what the cap tests hold open.
            handshakeTimeout: .seconds(120),
            requestTimeouts: timeouts,
            connectionLimits: limits
        )
    }

    struct TrickleOutcome {
        var piecesSent: Int
        var answer: String
    }

    /// Sends `piece(n)` every `trickleInterval` until the controller closes the connection, and returns what it
    /// answered and how many pieces had gone by then.
    static func trickle(
        on connection: TestHTTPConnection,
        piece: @escaping @Sendable (Int) -> String
    ) async throws -> TrickleOutcome {
        let sent = NIOLockedValueBox(0)
        let trickler = Task {
            for n in 0..<tricklePieces {
                // Sleep: the gaps of the trickle are the slow client the deadlines are tested against.
                try await Task.sleep(for: trickleInterval)
                try await connection.send(piece(n))
                sent.withLockedValue { $0 += 1 }
            }
        }
        defer { trickler.cancel() }
        var bytes = try await connection.readUntilClosed()
        let sentBeforeClose = sent.withLockedValue { $0 }
        return TrickleOutcome(piecesSent: sentBeforeClose, answer: bytes.readString(length: bytes.readableBytes) ?? "")
    }

    static func expectServes(port: Int, fixture: ControllerFixture) async throws {
        let client = ControllerClient(
            address: try ControllerAddress(parsing: "https://127.0.0.1:\(port)"),
            trust: .pinnedFingerprint(fixture.state.authority.fingerprint)
        )
        let info: ControllerAPI.EnrollInfo = try await client.call(.GET, "/v1/enroll/info")
        #expect(info.caCertificate == fixture.state.authority.certificatePEM)
    }

    static func capRefuses(limits: ConnectionLimiter.Limits, cap: String) async throws {
        try await ControllerFixture.with { fixture in
            let log = LogLines()
            let server = try server(fixture, limits: limits, logger: Logger(label: "test") { _ in log })
            let port = try #require(try await server.start().port)
            defer { Task { await server.shutdown() } }
            let capacity = min(limits.total, limits.perSource)
            var held: [TestHTTPConnection] = []
            for _ in 0..<capacity { held.append(try await TestHTTPConnection(port: port)) }
            // Three more: each is accepted by the kernel and closed by the controller before a byte is exchanged.
            for _ in 0..<3 {
                let refused = try await TestHTTPConnection(port: port)
                #expect(try await refused.closedByPeerWithoutBytes(within: .seconds(10) * Int(TestTiming.scale)))
            }
            let lines = log.lines.filter { $0.contains("too many open connections") }
            #expect(lines.count == 1, "refusals logged: \(lines)")
            #expect(lines.first?.contains("cap=\(cap)") == true && lines.first?.contains("source=127.0.0.1") == true)
            // The held connections were not disturbed, and once one closes a good client gets its slot.
            await held.removeLast().close()
            var answered = false
            for _ in 0..<50 where !answered {
                answered = (try? await expectServesQuietly(port: port, fixture: fixture)) == true
                if !answered { try await Task.sleep(for: .milliseconds(100)) }
            }
            #expect(answered, "no good client was served after a held connection closed")
            for connection in held { await connection.close() }
        }
    }

    static func expectServesQuietly(port: Int, fixture: ControllerFixture) async throws -> Bool {
        let client = ControllerClient(
            address: try ControllerAddress(parsing: "https://127.0.0.1:\(port)"),
            trust: .pinnedFingerprint(fixture.state.authority.fingerprint)
        )
        let info: ControllerAPI.EnrollInfo = try await client.call(.GET, "/v1/enroll/info")
        return info.caCertificate == fixture.state.authority.certificatePEM
    }
}

extension TestHTTPConnection {
    /// Whether the server closes the connection without sending a byte before `limit` (after which the test closes
    /// it, so a connection the server keeps open fails the test quickly instead of hanging it).
    func closedByPeerWithoutBytes(within limit: Duration) async throws -> Bool {
        let gaveUp = NIOLockedValueBox(false)
        let timer = Task {
            try await Task.sleep(for: limit)
            gaveUp.withLockedValue { $0 = true }
            await self.close()
        }
        defer { timer.cancel() }
        let bytes = (try? await readUntilClosed())?.readableBytes ?? 0
        return bytes == 0 && !gaveUp.withLockedValue { $0 }
    }
}

/// Every line a logger wrote, with its metadata, for tests that check what was logged.
final class LogLines: LogHandler, Sendable {
    private let box = NIOLockedValueBox<[String]>([])
    var lines: [String] { box.withLockedValue { $0 } }

    var metadata: Logger.Metadata {
        get { [:] }
        set {}
    }
    var logLevel: Logger.Level {
        get { .trace }
        set {}
    }
    subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { nil }
        set {}
    }

    func log(event: LogEvent) {
        let fields = (event.metadata ?? [:]).sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value)" }
        box.withLockedValue { $0.append("\(event.level) \(event.message) \(fields.joined(separator: " "))") }
    }
}
