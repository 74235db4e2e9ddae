import ILSCore
import Logging
import NIOConcurrencyHelpers
import NIOCore
import NIOHTTP1
import Testing

@testable import ILSProxy

@Suite("The access line's fields")
struct AccessLogTests {
    @Test("duration is milliseconds with three decimals, from whole microseconds, never negative")
    func durationMilliseconds() {
        #expect(AccessLog.milliseconds(0) == "0.000")
        #expect(AccessLog.milliseconds(999) == "0.000")
        #expect(AccessLog.milliseconds(5_000) == "0.005")
        #expect(AccessLog.milliseconds(50_000) == "0.050")
        #expect(AccessLog.milliseconds(1_234_567) == "1.234")
        #expect(AccessLog.milliseconds(12_000_000_000) == "12000.000")
        #expect(AccessLog.milliseconds(-3_000_000) == "0.000")
    }

    /// Keeps every line it is given.
    final class Sink: AccessLogSink {
        let lines = NIOLockedValueBox<[[(key: String, value: String)]]>([])
        func record(_ fields: [(key: String, value: String)]) { lines.withLockedValue { $0.append(fields) } }
    }

    /// Keeps every event logged through it.
    final class Events: LogHandler, @unchecked Sendable {
        var logLevel: Logger.Level = .info
        var metadata: Logger.Metadata = [:]
        let events = NIOLockedValueBox<[(String, Logger.Metadata)]>([])
        subscript(metadataKey key: String) -> Logger.Metadata.Value? {
            get { metadata[key] }
            set { metadata[key] = newValue }
        }
        func log(event: LogEvent) {
            events.withLockedValue { $0.append(("\(event.message)", event.metadata ?? [:])) }
        }
    }

    static func exchange() -> Exchange {
        let exchange = Exchange(
            head: HTTPRequestHead(version: .http1_1, method: .POST, uri: "/claude/query?token=secret"),
            rewrite: .failure(.malformedRequest)
        )
        exchange.status = .ok
        exchange.bytesIn = 12
        exchange.bytesOut = 3456
        return exchange
    }

    static let client = ClientContext(
        remoteAddress: try? SocketAddress(ipAddress: "10.1.2.3", port: 5000),
        scheme: .https,
        identity: PeerIdentity(id: "id-1", name: "ipad")
    )

    @Test("a sink gets every field, sorted by key, and never the query string")
    func sinkFields() throws {
        let sink = Sink()
        let logger = Logger(label: "test") { _ in Events() }
        AccessLog(logger: logger, sink: sink).record(Self.exchange(), client: Self.client, outcome: "upgraded")
        let line = try #require(sink.lines.withLockedValue { $0 }.first)
        let keys = line.map(\.key)
        #expect(keys == keys.sorted())
        #expect(
            keys == [
                "bytes_in", "bytes_out", "client", "duration_ms", "identity", "identity_id", "method", "outcome",
                "path", "status",
            ]
        )
        let values = Dictionary(uniqueKeysWithValues: line.map { ($0.key, $0.value) })
        #expect(values["bytes_in"] == "12")
        #expect(values["bytes_out"] == "3456")
        #expect(values["client"] == "10.1.2.3")
        #expect(values["identity"] == "ipad")
        #expect(values["identity_id"] == "id-1")
        #expect(values["method"] == "POST")
        #expect(values["path"] == "/claude/query")
        #expect(values["status"] == "200")
        #expect(!line.contains { $0.value.contains("secret") })
    }

    @Test("without a sink the same fields go through the logger; above info nothing is recorded at all")
    func loggerAndLevel() {
        let handler = Events()
        let logger = Logger(label: "test") { _ in handler }
        let sink = Sink()
        AccessLog(logger: logger, sink: nil).record(Self.exchange(), client: Self.client)
        let events = handler.events.withLockedValue { $0 }
        #expect(events.count == 1)
        #expect(events.first?.0 == "access")
        #expect(events.first?.1["status"] == "200")
        #expect(events.first?.1["path"] == "/claude/query")

        handler.logLevel = .notice
        AccessLog(logger: logger, sink: sink).record(Self.exchange(), client: Self.client)
        AccessLog(logger: logger, sink: nil).record(Self.exchange(), client: Self.client)
        #expect(sink.lines.withLockedValue { $0 }.isEmpty)
        #expect(handler.events.withLockedValue { $0 }.count == 1)
    }
}
