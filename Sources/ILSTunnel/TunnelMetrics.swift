import Metrics

/// What a tunnel counts (`--metrics`).
enum TunnelMetrics {
    static let connections = Counter(label: "ils_tunnel_connections_total")
    static let failures = Counter(label: "ils_tunnel_dial_failures_total")

    /// Requests the tunnel refused before they reached a circuit (`TunnelSitePolicy`), by refusal code.
    static func refused(_ code: String) -> Counter {
        Counter(label: "ils_tunnel_requests_refused_total", dimensions: [("code", code)])
    }
}
