import ILSFabric
import Metrics

/// What the controller counts (`--metrics`): connections, circuits, relayed bytes, dial latency, enrollments,
/// revocations and refusals by reason.
enum ControllerMetrics {
    static let circuitsActive = Meter(label: "ils_circuits_active")
    static let circuitsTotal = Counter(label: "ils_circuits_total")
    /// Admin writes answered before every gateway's connection took what they pushed (`LiveConnections.delivered`'s
    /// 2 s bound ran out): a gateway that stopped reading, or a full link.
    static let pushesUndelivered = Counter(label: "ils_policy_pushes_undelivered_total")
    static let bytesFromDevice = Counter(label: "ils_relay_bytes_total", dimensions: [("direction", "from_device")])
    static let bytesToDevice = Counter(label: "ils_relay_bytes_total", dimensions: [("direction", "to_device")])
    static let dialDuration = Timer(label: "ils_dial_duration_seconds")
    static let enrollments = Counter(label: "ils_enrollments_total")
    static let revocations = Counter(label: "ils_revocations_total")
    static let deviceConnections = Meter(label: "ils_overlay_connections", dimensions: [("kind", "device")])
    static let gatewayConnections = Meter(label: "ils_overlay_connections", dimensions: [("kind", "gateway")])
    /// Circuits whose two streams share an event loop (`same`), or whose bytes cross threads (`cross`: no gateway
    /// connection on the device connection's loop).
    static let sameLoopSplices = Counter(label: "ils_relay_splices_total", dimensions: [("loop", "same")])
    static let crossLoopSplices = Counter(label: "ils_relay_splices_total", dimensions: [("loop", "cross")])

    static func splice(sameLoop: Bool) {
        (sameLoop ? sameLoopSplices : crossLoopSplices).increment()
    }

    /// Connections open on the controller's port (`ConnectionLimiter`'s count: API, devices and gateways).
    static let connectionsOpen = Gauge(label: "ils_connections_open", dimensions: [("listener", "controller")])

    /// A connection the caps refused at accept.
    static func connectionRefused(_ cap: ConnectionLimiter.Cap) {
        Counter(
            label: "ils_connections_refused_total",
            dimensions: [("listener", "controller"), ("cap", cap.rawValue)]
        ).increment()
    }

    static func refusal(_ reason: String) {
        Counter(label: "ils_refusals_total", dimensions: [("reason", reason)]).increment()
    }
}
