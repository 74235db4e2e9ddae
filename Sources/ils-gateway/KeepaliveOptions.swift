import ArgumentParser
import ILSConfig
import ILSCore
import ILSFabric
import NIOCore

/// `--keepalive` and `--keepalive-timeout`, on every command that holds overlay connections: `serve` (overlay
/// mode), `tunnel` and `controller run`. Both ends of a connection ping on their own settings.
struct KeepaliveOptions: ParsableArguments {
    @Option(
        help: """
            Overlay connections: after this long with nothing received, send an HTTP/2 PING, so a link that a NAT \
            or firewall dropped without a word is noticed (and the idle mapping is kept alive). Default: 25s.
            """
    )
    var keepalive: String?

    @Option(
        help: """
            Overlay connections: close a connection (and redial, or stop routing to it) when nothing at all \
            arrives within this long after its PING. Default: 10s.
            """
    )
    var keepaliveTimeout: String?

    func resolve(_ layers: ConfigLayers) throws(ILSError) -> FabricKeepalive {
        let interval = try TimeSpan(parsing: layers.string(.keepalive, flag: keepalive) ?? "25s")
        let timeout = try TimeSpan(parsing: layers.string(.keepaliveTimeout, flag: keepaliveTimeout) ?? "10s")
        guard interval.nanoseconds >= 1_000_000_000 else {
            throw ILSError(.invalidArgument, "--keepalive must be at least 1s")
        }
        guard timeout.nanoseconds >= 1_000_000_000 else {
            throw ILSError(.invalidArgument, "--keepalive-timeout must be at least 1s")
        }
        return FabricKeepalive(interval: .nanoseconds(interval.nanoseconds), timeout: .nanoseconds(timeout.nanoseconds))
    }

    /// `--idle-timeout` (tunnel): how long a device's controller connection stays open with no circuit (0: open).
    static func idle(_ layers: ConfigLayers, flag: String?) throws(ILSError) -> FabricKeepalive.Idle {
        guard let raw = layers.string(.idleTimeout, flag: flag) else { return .standard }
        let span = try TimeSpan(parsing: raw)
        return FabricKeepalive.Idle(closeAfter: span.nanoseconds == 0 ? nil : .nanoseconds(span.nanoseconds))
    }
}
