import ILSCore
import Logging
import NIOCore

/// One line per request, after it ends: what was asked, how it ended, how much moved each way. Never a body, a query
/// string or a header value.
struct AccessLog {
    let logger: Logger

    func record(_ exchange: Exchange, client: ClientContext, outcome: String? = nil) {
        let elapsed = NIODeadline.now() - exchange.startedAt
        var metadata: Logger.Metadata = [
            "method": "\(exchange.method.rawValue)",
            "path": "\(exchange.logPath)",
            "status": "\(exchange.status.map { String($0.code) } ?? "-")",
            "bytes_in": "\(exchange.bytesIn)",
            "bytes_out": "\(exchange.bytesOut)",
            "duration_ms": .string(Self.milliseconds(elapsed.nanoseconds)),
            "client": "\(client.forwardedFor)",
        ]
        if let identity = client.identity {
            metadata["identity"] = "\(identity.name)"
            metadata["identity_id"] = "\(identity.id)"
        }
        if let code = exchange.errorCode { metadata["error"] = "\(code)" }
        if let outcome { metadata["outcome"] = "\(outcome)" }
        logger.info("access", metadata: metadata)
    }

    /// Milliseconds with three decimals (`"12.345"`), by integer arithmetic: formatting a `Double` was the costliest
    /// field of the line.
    static func milliseconds(_ nanoseconds: Int64) -> String {
        let micros = max(0, nanoseconds / 1000)
        let fraction = String(micros % 1000)
        return "\(micros / 1000)." + String(repeating: "0", count: 3 - fraction.utf8.count) + fraction
    }
}
