public import ILSCore

/// Everything the streaming proxy core needs to know about its backend and its limits.
///
/// The defaults are written for a Claude Code backend: a non-streamed `POST /claude/query` may think for minutes
/// before it sends response headers, so the header timeout is long; a stream that keeps moving is never cut.
public struct ProxyConfiguration: Sendable {
    /// Where requests go.
    public var backend: BackendURL
    /// How long a TCP connection to the backend may take to establish.
    public var backendConnectTimeout: TimeSpan = .seconds(5)
    /// How long the backend may take to send response headers after the request head was sent. A body that is
    /// streaming is never subject to a timeout.
    public var backendHeaderTimeout: TimeSpan = .seconds(300)
    /// How long an unused keep-alive connection to the backend is kept. Shorter than uvicorn's default keep-alive
    /// (5 s) so the gateway, not the backend, closes idle connections, which avoids racing a request against the
    /// backend's close.
    public var backendIdleTimeout: TimeSpan = .seconds(4)
    /// The most connections to the backend open at once, across all event loops.
    public var backendMaxConnections: Int = 16384
    /// How long a request waits for a backend connection when `backendMaxConnections` are all busy.
    public var backendPoolWaitTimeout: TimeSpan = .seconds(10)
    /// How long a client connection may stay open without a request in progress. This also bounds how long a
    /// client may take to send a complete request head, which defeats slow-header (slowloris) clients.
    public var clientIdleTimeout: TimeSpan = .seconds(60)
    /// How long a client may take nothing at all from a response before the exchange is given up (the backend
    /// request is closed too). A slow reader is fine; a reader that has stopped for this long is gone, and must not
    /// hold a backend connection forever.
    public var clientStallTimeout: TimeSpan = .seconds(600)
    /// Called, on the connection's event loop, each time a client is cut for taking nothing for
    /// `clientStallTimeout`: the gateway counts them (`ils_gateway_circuits_stalled_total`,
    /// `ils_connections_stalled_total`). It must not block.
    public var clientStalled: (@Sendable () -> Void)?
    /// The largest request head accepted, in bytes, before answering 431.
    public var maxRequestHeaderBytes: Int = 64 * 1024
    /// The most header fields accepted in one request head before answering 431.
    public var maxRequestHeaderCount: Int = 128
    /// Where access lines go; through the proxy's `Logger` when nil.
    public var accessLog: (any AccessLogSink)?

    public init(backend: BackendURL) {
        self.backend = backend
    }
}
