import ILSCore
import Logging
import NIOCore

/// Takes the proxy's access lines instead of its `Logger`: one call per line, the fields sorted by key. The binary
/// writes them straight to stderr in its log format; building swift-log's metadata dictionary (and the handler
/// merging and sorting it) cost more than formatting the line.
public protocol AccessLogSink: Sendable {
    func record(_ fields: [(key: String, value: String)])
}

/// One line per request, after it ends: what was asked, how it ended, how much moved each way. Never a body, a query
/// string or a header value.
struct AccessLog {
    let logger: Logger
    /// Where lines go; through `logger` (message `access`, the fields as metadata) when nil.
    let sink: (any AccessLogSink)?

    func record(_ exchange: Exchange, client: ClientContext, outcome: String? = nil) {
        guard logger.logLevel <= .info else { return }
        let fields = Self.fields(
            exchange,
            client: client,
            outcome: outcome,
            elapsed: NIODeadline.now() - exchange.startedAt
        )
        if let sink {
            sink.record(fields)
        } else {
            logger.info(
                "access",
                metadata: Logger.Metadata(uniqueKeysWithValues: fields.map { ($0.key, .string($0.value)) })
            )
        }
    }

    /// The line's fields, sorted by key.
    static func fields(
        _ exchange: Exchange,
        client: ClientContext,
        outcome: String?,
        elapsed: TimeAmount
    ) -> [(key: String, value: String)] {
        var fields: [(key: String, value: String)] = []
        fields.reserveCapacity(11)
        fields.append(("bytes_in", String(exchange.bytesIn)))
        fields.append(("bytes_out", String(exchange.bytesOut)))
        fields.append(("client", client.forwardedFor))
        fields.append(("duration_ms", milliseconds(elapsed.nanoseconds)))
        if let code = exchange.errorCode { fields.append(("error", code)) }
        if let identity = client.identity {
            fields.append(("identity", identity.name))
            fields.append(("identity_id", identity.id))
        }
        fields.append(("method", exchange.method.rawValue))
        if let outcome { fields.append(("outcome", outcome)) }
        fields.append(("path", exchange.logPath))
        fields.append(("status", exchange.status.map { String($0.code) } ?? "-"))
        return fields
    }

    /// Milliseconds with three decimals (`"12.345"`), by integer arithmetic: formatting a `Double` was the costliest
    /// field of the line.
    static func milliseconds(_ nanoseconds: Int64) -> String {
        let micros = max(0, nanoseconds / 1000)
        let fraction = String(micros % 1000)
        return "\(micros / 1000)." + String(repeating: "0", count: 3 - fraction.utf8.count) + fraction
    }
}
