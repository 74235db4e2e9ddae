import ILSFabric
import Logging

extension HTTPModeServer {
    /// The caps of `configuration.connectionLimits` on the listener: open connections and refusals in the metrics,
    /// a refusal logged once per client address per minute (a flood must not become a flood of log lines).
    static func connectionLimitHandler(
        _ limits: ConnectionLimiter.Limits,
        logger: Logger
    ) -> ConnectionLimitHandler {
        ConnectionLimitHandler(
            limiter: ConnectionLimiter(limits: limits),
            observer: ConnectionLimitHandler.Observer(
                openChanged: { GatewayMetrics.connectionsOpen.record($0) },
                refused: { refusal in
                    GatewayMetrics.connectionRefused(refusal.cap)
                    guard refusal.logged else { return }
                    logger.warning(
                        "connection refused: too many open connections",
                        metadata: [
                            "source": "\(refusal.source)", "cap": "\(refusal.cap.rawValue)",
                            "unlogged_refusals": "\(refusal.unlogged)",
                        ]
                    )
                }
            )
        )
    }
}
