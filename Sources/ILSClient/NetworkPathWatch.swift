#if canImport(Network)
public import Network
import Dispatch

// Compiled only where Apple's Network framework exists (iOS, macOS, visionOS): not on Linux, so never built or run
// here. What runs everywhere is `OverlayClient.networkChanged()`, which this calls.
extension OverlayClient {
    /// Watches the device's network path with an `NWPathMonitor` and calls `networkChanged()` when it changes (an
    /// interface or address comes or goes, the path becomes satisfied again), so circuits move to a new connection
    /// at once instead of after the keepalive finds the old one dead. Keep the returned monitor; `cancel()` it to
    /// stop. The first update (the path as it is now) is not a change.
    public func watchNetworkPath(queue: DispatchQueue = DispatchQueue(label: "ils.network-path")) -> NWPathMonitor {
        let monitor = NWPathMonitor()
        let seen = LastPath()
        monitor.pathUpdateHandler = { [weak self] path in
            let last = seen.path
            seen.path = path
            guard let last, path != last else { return }
            // Only a usable path is worth a new connection; an unsatisfied one ends with the keepalive or the next
            // update.
            guard path.status == .satisfied else { return }
            self?.networkChanged()
        }
        monitor.start(queue: queue)
        return monitor
    }
}
/// The path the monitor reported last; touched only on the monitor's serial queue.
private final class LastPath: @unchecked Sendable {
    var path: NWPath?
}
#endif
