import ILSFabric
import ILSProxy
import Metrics

/// What an overlay gateway counts (`--metrics`).
enum GatewayMetrics {
    static let circuitsActive = Meter(label: "ils_gateway_circuits_active")
    static let circuitsTotal = Counter(label: "ils_gateway_circuits_total")
    /// Circuits the device ended with its sealed CANCEL record (suite 4): it gave up, as opposed to a path lost.
    static let circuitsCancelled = Counter(label: "ils_gateway_circuits_cancelled_total")
    /// Circuits moved to a new path by the device's resumption (suite 5), and those that ran out of grace.
    static let circuitsResumed = Counter(label: "ils_gateway_circuits_resumed_total")
    static let circuitsNotResumed = Counter(label: "ils_gateway_circuits_not_resumed_total")
    /// Circuits held now (their path lost, waiting for the device), and the bytes every circuit keeps for resumption
    /// (what the devices have not acknowledged): recorded at each scrape.
    static let circuitsHeld = Gauge(label: "ils_gateway_circuits_held")
    static let keptBytes = Gauge(label: "ils_gateway_resumption_kept_bytes")
    /// What held circuits keep, with each one's reservation of a read (at most `--resume-total`).
    static let heldBytes = Gauge(label: "ils_gateway_resumption_held_bytes")

    /// Circuits that lost their path and were not held, by the bound that refused them (`total`: `--resume-total`,
    /// `identity`: `--resume-held-per-identity`).
    static func notHeld(_ bound: RetentionBudget.Refusal, count: Int) {
        Counter(label: "ils_gateway_circuits_not_held_total", dimensions: [("bound", bound.rawValue)])
            .increment(by: count)
    }
    /// Attached circuits cut because their device acknowledged nothing for `--client-stall-timeout` while they were
    /// at their bound (the third bound on what a device makes the gateway keep, beside the two above).
    static let circuitsStalled = Counter(label: "ils_gateway_circuits_stalled_total")
    @Sendable static func circuitStalled() { circuitsStalled.increment() }
    static let connected = Gauge(label: "ils_gateway_connected")
    /// Connections to the controller: one per relay event loop when all are up.
    static let links = Gauge(label: "ils_gateway_controller_links")

    /// HTTP mode: client connections open (`ConnectionLimiter`'s count).
    static let connectionsOpen = Gauge(label: "ils_connections_open", dimensions: [("listener", "http")])

    /// HTTP mode: a client connection the caps refused at accept.
    static func connectionRefused(_ cap: ConnectionLimiter.Cap) {
        Counter(label: "ils_connections_refused_total", dimensions: [("listener", "http"), ("cap", cap.rawValue)])
            .increment()
    }

    /// HTTP mode: a client connection cut because it took nothing of a response for `--client-stall-timeout`.
    @Sendable static func httpClientStalled() {
        Counter(label: "ils_connections_stalled_total", dimensions: [("listener", "http")]).increment()
    }

    static func refusal(_ reason: String) {
        Counter(label: "ils_gateway_refusals_total", dimensions: [("reason", reason)]).increment()
    }
}

extension ProxyConfiguration {
    /// This configuration, with `count` called for each stalled client before the hook it had (a test's, say).
    func countingStalls(_ count: @escaping @Sendable () -> Void) -> ProxyConfiguration {
        var counted = self
        let given = clientStalled
        counted.clientStalled = {
            count()
            given?()
        }
        return counted
    }
}
