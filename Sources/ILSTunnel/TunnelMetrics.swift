import Metrics

/// What a tunnel counts (`--metrics`).
enum TunnelMetrics {
    static let connections = Counter(label: "ils_tunnel_connections_total")
    static let failures = Counter(label: "ils_tunnel_dial_failures_total")
}
