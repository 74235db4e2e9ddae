import NIOCore
import NIOHTTP1

/// One request and its response: what the access line reports, the request as it goes to the backend, and its
/// lifecycle (`machine`). Confined to the client connection's event loop.
final class Exchange {
    let method: HTTPMethod
    /// The path without its query: the query may carry secrets and is never logged.
    let logPath: String
    let requestVersion: HTTPVersion
    let startedAt: NIODeadline
    /// The request as it goes to the backend; nil when the gateway refused it (`refusal`).
    let forwarded: ForwardedRequest?
    /// Why the gateway refused the request head itself, before any backend saw it.
    let refusal: ProxyError?
    var machine: ExchangeMachine
    /// Request parts that arrived before a backend connection was ready; bounded because client reads are held
    /// while waiting.
    var buffered: [HTTPClientRequestPart] = []
    var status: HTTPResponseStatus?
    var errorCode: String?
    var bytesIn = 0
    var bytesOut = 0

    /// `rewrite` is the head as the backend gets it, or why it may not go there.
    init(head: HTTPRequestHead, rewrite: Result<ForwardedRequest, ProxyError>, startedAt: NIODeadline = .now()) {
        method = head.method
        let path = head.uri.split(separator: "?", maxSplits: 1, omittingEmptySubsequences: false).first ?? ""
        logPath = path.count > 256 ? String(path.prefix(256)) + "…" : String(path)
        requestVersion = head.version
        self.startedAt = startedAt
        switch rewrite {
        case .success(let forwarded): (self.forwarded, refusal) = (forwarded, nil)
        case .failure(let error): (forwarded, refusal) = (nil, error)
        }
        machine = ExchangeMachine(
            method: head.method,
            version: head.version,
            forwarded: forwarded,
            expectsContinue: forwarded != nil && head.headers["expect"].contains { $0.lowercased() == "100-continue" }
        )
    }
}
