import NIOCore
import NIOHTTP1

/// One request and its response, from the request head to the last byte either way. Confined to the client
/// connection's event loop.
final class Exchange {
    let method: HTTPMethod
    /// The path without its query: the query may carry secrets and is never logged.
    let logPath: String
    let requestVersion: HTTPVersion
    let startedAt: NIODeadline
    var forwarded: ForwardedRequest?
    /// Request parts that arrived before a backend connection was ready; bounded because client reads are held
    /// while waiting.
    var buffered: [HTTPClientRequestPart] = []
    var requestComplete = false
    var responseHeadSent = false
    var responseComplete = false
    var closeAfterResponse = false
    var backendKeepAlive = true
    var status: HTTPResponseStatus?
    var errorCode: String?
    var bytesIn = 0
    var bytesOut = 0
    /// How many backend connections this exchange has tried; a request is retried at most once.
    var attempts = 0
    /// When the backend must have sent the response head by (`--backend-header-timeout`); checked lazily by the
    /// handler's one header timer.
    var headerDeadline: NIODeadline?
    /// The backend's 101 answer to an upgrade request, held until its `.end` arrives.
    var switchingProtocols: HTTPResponseHead?

    init(head: HTTPRequestHead) {
        method = head.method
        let path = head.uri.split(separator: "?", maxSplits: 1, omittingEmptySubsequences: false).first ?? ""
        logPath = path.count > 256 ? String(path.prefix(256)) + "…" : String(path)
        requestVersion = head.version
        startedAt = .now()
    }

    /// A request may go to a second backend connection only when the first was a reused keep-alive connection that
    /// failed before answering (the backend may have closed it just as we sent), and nothing but the head, which we
    /// still have, was sent. Requests with a body are never replayed.
    var isRetryable: Bool {
        guard let forwarded, reusedConnection else { return false }
        let idempotent: [HTTPMethod] = [.GET, .HEAD, .OPTIONS, .PUT, .DELETE]
        return attempts == 1 && idempotent.contains(method) && !forwarded.hasBody && !forwarded.isUpgrade
            && !responseHeadSent
    }

    /// The backend connection had carried an earlier request: only then can a close before answering mean the
    /// backend closed an idle connection just as we sent, rather than this request's fault.
    var reusedConnection = false
    /// The client asked `Expect: 100-continue`; the gateway answers it itself once a backend connection is ready.
    var expectsContinue = false
}
