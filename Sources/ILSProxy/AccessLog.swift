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
            "duration_ms": "\(Double(elapsed.nanoseconds / 1000) / 1000)",
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
}
