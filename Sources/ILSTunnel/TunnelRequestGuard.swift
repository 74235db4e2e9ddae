import Foundation
import ILSCore
import Logging
import Metrics
import NIOConcurrencyHelpers
import NIOCore

/// Who may send requests into the tunnel: the device's own programs, not the web pages its browser shows.
///
/// A program on the device acts as the device by design. A web page does not: a page whose name resolves to
/// 127.0.0.1 (DNS rebinding) or any page's cross-site `fetch` reaches the tunnel's port too, and behind the tunnel
/// sits a backend that acts on the user's machine. A browser always says who is asking: the `Host` it addressed,
/// the `Origin` of the page, and `Sec-Fetch-Site`. So:
/// - `Host` must be a loopback name, the listen address, the service's name, or an `--allowed-host`: else 421;
/// - an `Origin` other than the tunnel's own (`http://` an allowed host `:` the port the client connected to), or
///   `Sec-Fetch-Site: cross-site` / `same-site`, is 403 unless `--allow-origin` names that origin;
/// - `CONNECT` is 405 (a tunnel to an HTTP API carries no tunnels).
/// curl, the app's own code and other programs send no `Origin` or `Sec-Fetch-Site`, and a loopback `Host`.
struct TunnelSitePolicy: Sendable {
    let hosts: HostAllowList
    /// `scheme://host[:port]`, lowercased, without a default port.
    let allowedOrigins: Set<String>

    init(listenHost: String, service: String, allowedHosts: [String], allowedOrigins: [String]) {
        self.hosts = HostAllowList(listenHost: listenHost, allowedHosts: allowedHosts + [service])
        self.allowedOrigins = Set(allowedOrigins.compactMap(Self.normalized(origin:)))
    }

    /// Refuses an `--allowed-host` or `--allow-origin` that could never match.
    static func validate(allowedHosts: [String], allowedOrigins: [String]) throws(ILSError) {
        for host in allowedHosts { try HostAllowList.validate(allowedHost: host) }
        for origin in allowedOrigins where normalized(origin: origin) == nil {
            throw ILSError(
                .invalidArgument,
                "--allow-origin must be an origin like http://localhost:3000 (scheme, host, optional port; no path), "
                    + "not '\(ControlCharacters.bounded(origin, limit: 60))'"
            )
        }
    }

    enum Verdict: Equatable {
        case allowed
        /// `subject` is what the log names: the page's origin, or the Host for a rebinding.
        case refused(TunnelRefusal, subject: String)
    }

    /// The verdict on one request head, sent on a connection accepted on `localPort`.
    func check(_ head: TunnelRequestHead, localPort: Int?) -> Verdict {
        if head.method == "CONNECT" {
            return .refused(
                TunnelRefusal(status: 405, code: "method_not_allowed", reason: "the tunnel does not carry CONNECT"),
                subject: "CONNECT"
            )
        }
        let hostValues = head.values("host")
        guard hostValues.count <= 1 else {
            return .refused(
                TunnelRefusal(status: 400, code: "malformed_request", reason: "the request has two Host headers"),
                subject: "two Host headers"
            )
        }
        for authority in hostValues + [Self.authority(ofTarget: head.target)].compactMap({ $0 })
        where !hosts.allows(authority: authority) {
            return .refused(
                TunnelRefusal(
                    status: 421,
                    code: "misdirected_request",
                    reason: "the tunnel answers loopback names, its listen address and its service's name only "
                        + "(a web page reached through another name is refused); give --allowed-host for another"
                ),
                subject: "Host \(authority)"
            )
        }
        let origin = head.values("origin").first
        let named = origin.flatMap(Self.normalized(origin:)).map { allowedOrigins.contains($0) } ?? false
        if named { return .allowed }
        if let origin, !isOwn(origin: origin, localPort: localPort) {
            return .refused(crossSite("a web page from another origin"), subject: origin)
        }
        if let site = head.values("sec-fetch-site").first?.lowercased(), site == "cross-site" || site == "same-site" {
            return .refused(
                crossSite("the browser says the request is \(site)"),
                subject: origin ?? Self.referrerOrigin(head) ?? "Sec-Fetch-Site \(site)"
            )
        }
        return .allowed
    }

    private func crossSite(_ why: String) -> TunnelRefusal {
        TunnelRefusal(
            status: 403,
            code: "cross_site_request",
            reason: "\(why): the tunnel serves this device's programs, not web pages; give --allow-origin to let "
                + "one origin in"
        )
    }

    /// `http://` an allowed host `:` the port this connection was accepted on: a page the tunnel itself served.
    private func isOwn(origin: String, localPort: Int?) -> Bool {
        guard let normalized = Self.normalized(origin: origin), normalized.hasPrefix("http://") else { return false }
        let authority = String(normalized.dropFirst("http://".count))
        guard hosts.allows(authority: authority), let localPort else { return false }
        return Self.port(ofAuthority: authority, default: 80) == localPort
    }

    /// The origin part of the `Referer`, for the log only: a browser sends no `Origin` with a cross-site GET, and
    /// grouping its refusals by the page that sent them keeps one line per page.
    static func referrerOrigin(_ head: TunnelRequestHead) -> String? {
        guard let referrer = head.values("referer").first, let scheme = referrer.range(of: "://") else { return nil }
        let end = referrer[scheme.upperBound...].firstIndex { $0 == "/" || $0 == "?" || $0 == "#" } ?? referrer.endIndex
        return normalized(origin: String(referrer[..<end]))
    }

    /// The authority of an absolute-form target (`http://name:port/path`), which names the host as `Host` does.
    static func authority(ofTarget target: String) -> String? {
        guard !target.hasPrefix("/"), let range = target.range(of: "://") else { return nil }
        let rest = target[range.upperBound...]
        return String(rest.prefix { $0 != "/" && $0 != "?" && $0 != "#" })
    }

    /// `scheme://host[:port]` lowercased, the default port dropped; nil for `null` or anything with a path.
    static func normalized(origin: String) -> String? {
        let lowered = origin.lowercased()
        let scheme: String
        if lowered.hasPrefix("http://") {
            scheme = "http"
        } else if lowered.hasPrefix("https://") {
            scheme = "https"
        } else {
            return nil
        }
        let authority = String(lowered.dropFirst(scheme.count + 3))
        guard !authority.isEmpty, !authority.contains("/"), !authority.contains("@"),
            HostAllowList.host(ofAuthority: authority) != nil,
            let port = port(ofAuthority: authority, default: scheme == "http" ? 80 : 443)
        else { return nil }
        let host =
            authority.hasPrefix("[")
            ? String(authority.prefix { $0 != "]" }) + "]" : String(authority.prefix { $0 != ":" })
        return port == (scheme == "http" ? 80 : 443) ? "\(scheme)://\(host)" : "\(scheme)://\(host):\(port)"
    }

    /// The port of `name:port` or `[v6]:port`, `default` without one, nil when it is not a port.
    static func port(ofAuthority authority: String, default defaultPort: Int) -> Int? {
        let afterHost =
            authority.hasPrefix("[") ? authority.drop { $0 != "]" }.dropFirst() : authority.drop { $0 != ":" }
        guard !afterHost.isEmpty else { return defaultPort }
        guard afterHost.first == ":", afterHost.count > 1, afterHost.count <= 6 else { return nil }
        guard let port = Int(afterHost.dropFirst()), (0...65535).contains(port) else { return nil }
        return port
    }
}

/// One warning per refused origin (or Host) and reason a minute, then one line with the count: a page can send
/// thousands of requests, and each must not be a log line.
final class TunnelRefusalLog: Sendable {
    private let aggregator = NIOLockedValueBox(RefusalAggregator(window: 60, maximumSources: 64))
    private let logger: Logger

    init(logger: Logger) {
        self.logger = logger
    }

    func record(subject: String, refusal: TunnelRefusal, now: Int64) {
        TunnelMetrics.refused(refusal.code).increment()
        let rows = aggregator.withLockedValue {
            $0.record(source: ControlCharacters.bounded(subject, limit: 200), code: refusal.code, now: now)
        }
        write(rows, reason: refusal.reason)
    }

    /// The counts of the window so far (called once a minute by the tunnel).
    func drain() {
        write(aggregator.withLockedValue { $0.drain() }, reason: nil)
    }

    private func write(_ rows: [RefusalAggregator.Row], reason: String?) {
        for row in rows {
            let parts = row.detail.split(separator: " ", maxSplits: 1)
            var metadata: Logger.Metadata = ["from": "\(row.actor)", "code": "\(parts[0])"]
            if parts.count > 1 {
                metadata["more"] = "\(parts[1].dropFirst("count=".count))"
                logger.warning("tunnel refused more requests from a web page in the last minute", metadata: metadata)
            } else {
                if let reason { metadata["reason"] = "\(reason)" }
                logger.warning("tunnel refused a request (once a minute per origin)", metadata: metadata)
            }
        }
    }
}

/// Checks every request head a local client sends (`TunnelSitePolicy`) before its bytes go on toward the circuit.
/// The first request of a connection is checked before any circuit is dialled, so a refused one reaches nothing and is
/// answered in the gateway's JSON error format; a refused request on a connection that already carries a circuit
/// resets the connection (an answer would have to wait for the answers before it), and nothing of it is forwarded.
final class TunnelRequestGuard: ChannelInboundHandler {
    typealias InboundIn = ByteBuffer
    typealias InboundOut = ByteBuffer

    private let policy: TunnelSitePolicy
    private let refusals: TunnelRefusalLog
    private var framing = RequestFraming()
    private var allowedRequests = 0
    private var refused = false

    init(policy: TunnelSitePolicy, refusals: TunnelRefusalLog) {
        self.policy = policy
        self.refusals = refusals
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        guard !refused else { return }
        let steps: [RequestFraming.Step]
        do {
            steps = try framing.feed(unwrapInboundIn(data))
        } catch {
            refuse(
                context: context,
                TunnelRefusal(status: error.status, code: error.code, reason: error.reason),
                subject: "malformed request"
            )
            return
        }
        for step in steps {
            switch step {
            case .forward(let bytes):
                context.fireChannelRead(wrapInboundOut(bytes))
            case .head(let head, let bytes):
                switch policy.check(head, localPort: context.channel.localAddress?.port) {
                case .allowed:
                    allowedRequests += 1
                    context.fireChannelRead(wrapInboundOut(bytes))
                case .refused(let refusal, let subject):
                    refuse(context: context, refusal, subject: subject)
                    return
                }
            }
        }
    }

    private func refuse(context: ChannelHandlerContext, _ refusal: TunnelRefusal, subject: String) {
        refused = true
        refusals.record(subject: subject, refusal: refusal, now: Int64(Date().timeIntervalSince1970))
        if allowedRequests == 0 {
            refusal.send(to: context.channel)
            context.read()
        } else {
            CircuitErrorLogger.reset(context.channel)
        }
    }
}
