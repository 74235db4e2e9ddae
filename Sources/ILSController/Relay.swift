import Foundation
import ILSCore
import ILSFabric
import ILSStore
import Logging
import NIOConcurrencyHelpers
import NIOCore
import NIOHPACK
import NIOHTTP2

/// The controller's relay: which gateways host which service, and the splice of each device circuit onto one of
/// them. It authorizes dials against the service's policy and never sees plaintext.
final class Relay: Sendable {
    struct Host: Sendable {
        let key: ObjectIdentifier
        let identity: IdentityRecord
        let channel: any Channel
        let multiplexer: NIOHTTP2Handler.StreamMultiplexer
    }

    private struct State {
        var hosts: [String: [Host]] = [:]
        var nextIndex: [String: Int] = [:]
        var sessions: [ObjectIdentifier: SessionEntry] = [:]
        /// Gateway links whose certificate is no longer current but still carried circuits when that was found:
        /// closed when their last circuit ends.
        var superseded: Set<ObjectIdentifier> = []
        var sameLoopSplices = 0
        var crossLoopSplices = 0
    }

    /// A live circuit and its byte counters (updated by the two `RelayHandler`s).
    final class SessionEntry: Sendable {
        let info: ControllerAPI.Session
        /// The gateway link the circuit is spliced onto.
        let host: ObjectIdentifier
        /// The device's end of the circuit: closing it ends the circuit (`cut(service:keeping:)`).
        let deviceStream: any Channel
        let counters = NIOLockedValueBox((up: 0, down: 0))
        /// Set by `cut`, before any gateway hears of the change: nothing more of the gateway's goes to the device.
        let severed = NIOLockedValueBox(false)

        init(info: ControllerAPI.Session, host: ObjectIdentifier, deviceStream: any Channel) {
            self.info = info
            self.host = host
            self.deviceStream = deviceStream
        }

        var snapshot: ControllerAPI.Session {
            var info = self.info
            (info.bytesFromDevice, info.bytesToDevice) = counters.withLockedValue { ($0.up, $0.down) }
            return info
        }
    }

    /// The live circuits, for `admin sessions`.
    func sessions() -> [ControllerAPI.Session] {
        state.withLockedValue { Array($0.sessions.values) }.map(\.snapshot).sorted { $0.startedAt < $1.startedAt }
    }

    /// Ends every circuit to `service` whose device is not in `keeping` (a policy change took its permission away),
    /// each as a revocation does: the device's stream closes, and the relay closes the gateway's. Returns the
    /// sessions cut. A dial decided before the change but not yet spliced is refused at the splice instead
    /// (`attempt`), under the same lock, so none slips between the two.
    func cut(service: String, keeping: Set<String>) -> [ControllerAPI.Session] {
        let doomed = state.withLockedValue { state in
            state.sessions.values.filter { $0.info.service == service && !keeping.contains($0.info.deviceID) }
        }
        // Reset with a code of its own, so the device ends the circuit with `dial_denied` instead of resuming it; the
        // stream closes with the reset (a stream already gone fails the write: it is closed all the same). A device
        // that may no longer connect at all (revoked, disabled, deleted: its connection is being closed with its own
        // notice, `BlockedNotice`) is not told `dial_denied`: its stream just closes.
        // Severed first, here and now, before the caller tells the gateways: a gateway ends the circuit itself with a
        // CANCEL, which came back on a busy loop ahead of the reset queued below (an event loop serves the I/O it
        // finds ready before its queued tasks), and the device reported `truncated` instead of `dial_denied`.
        for session in doomed { session.severed.withLockedValue { $0 = true } }
        let directory = controller.state.identities
        for session in doomed {
            let stream = session.deviceStream
            guard directory.identity(id: session.info.deviceID)?.state == .active else {
                stream.close(promise: nil)
                continue
            }
            stream.writeAndFlush(HTTP2Frame.FramePayload.rstStream(FabricProtocol.dialDeniedReset)).whenFailure { _ in
                stream.close(promise: nil)
            }
        }
        return doomed.map(\.info)
    }

    /// The gateways hosting each service through this controller, with their link counts.
    func hosting() -> [String: [ControllerAPI.ServiceHost]] {
        let address = controller.state.address.description
        return state.withLockedValue { state in
            state.hosts.mapValues { hosts in
                Dictionary(grouping: hosts, by: \.identity.name).map { name, links in
                    ControllerAPI.ServiceHost(gateway: name, links: links.count, controller: address)
                }.sorted { $0.gateway < $1.gateway }
            }
        }
    }

    private let state = NIOLockedValueBox(State())
    private let controller: Controller
    private let live: LiveConnections
    private let logger: Logger
    /// How long a gateway may take to accept a circuit before the relay tries another.
    private let gatewayTimeout: TimeAmount
    /// What one identity may hold and open (`CircuitLimiter`).
    let circuitLimiter: CircuitLimiter
    /// "A gateway did not take a circuit", at most once per link per interval with the count (`LogTally`).
    private let untaken: LogTally<ObjectIdentifier>
    /// "Over its cap", at most once per identity a minute with the count.
    private let overCap: LogTally<String>

    init(
        controller: Controller,
        live: LiveConnections,
        gatewayTimeout: TimeAmount,
        circuitLimits: CircuitLimiter.Limits = .standard,
        logger: Logger
    ) {
        self.controller = controller
        self.live = live
        self.gatewayTimeout = gatewayTimeout
        self.circuitLimiter = CircuitLimiter(limits: circuitLimits)
        self.untaken = LogTally(interval: .seconds(10))
        self.overCap = LogTally(interval: .seconds(60))
        self.logger = logger
    }

    func register(_ host: Host, service: String) {
        state.withLockedValue { $0.hosts[service, default: []].append(host) }
        logger.info("gateway hosts service", metadata: ["gateway": "\(host.identity.name)", "service": "\(service)"])
        host.channel.closeFuture.whenComplete { _ in
            self.state.withLockedValue { state in
                state.hosts[service]?.removeAll { $0.key == host.key }
                state.superseded.remove(host.key)
            }
            self.logger.info("gateway left", metadata: ["gateway": "\(host.identity.name)", "service": "\(service)"])
        }
    }

    /// The gateways of `service` to try, in order: first the connections on `loop` (the device connection's event
    /// loop), so the circuit is spliced without crossing threads, then the others; each group starts after the one
    /// used last, so dials spread across gateways.
    private func candidates(for service: String, near loop: any EventLoop) -> [Host] {
        state.withLockedValue { state in
            let hosts = state.hosts[service] ?? []
            guard !hosts.isEmpty else { return [] }
            let turn = state.nextIndex[service] ?? 0
            state.nextIndex[service] = turn &+ 1
            func rotated(_ hosts: [Host]) -> [Host] {
                guard !hosts.isEmpty else { return [] }
                let start = turn % hosts.count
                return Array(hosts[start...] + hosts[..<start])
            }
            return rotated(hosts.filter { $0.channel.eventLoop === loop })
                + rotated(hosts.filter { $0.channel.eventLoop !== loop })
        }
    }

    /// Circuits spliced so far, by whether both streams shared an event loop (for tests and metrics).
    var splices: (sameLoop: Int, crossLoop: Int) {
        state.withLockedValue { ($0.sameLoopSplices, $0.crossLoopSplices) }
    }

    /// Decides a device's circuit: the identity's caps first (`CircuitLimiter`, before any work for a gateway), then
    /// policy, then the first gateway that accepts it. The circuit counts against its identity until its stream
    /// closes, whatever the decision.
    func dial(
        service: String,
        device: IdentityRecord,
        stream: any Channel,
        resuming gateway: String? = nil
    ) -> EventLoopFuture<CircuitDecision> {
        let started = ContinuousClock.now
        switch circuitLimiter.admit(identityID: device.id) {
        case .admitted:
            let limiter = circuitLimiter
            stream.closeFuture.whenComplete { _ in limiter.release(identityID: device.id) }
        case .refused(let cap):
            ControllerMetrics.refusal(cap.rawValue)
            if let count = overCap.record(key: device.id) {
                logger.warning(
                    "circuit refused: the identity is over its cap (once a minute per identity)",
                    metadata: [
                        "identity": "\(device.name)", "cap": "\(cap.rawValue)",
                        "limits": "\(circuitLimiter.limits)", "since_last_line": "\(count)",
                    ]
                )
            }
            return stream.eventLoop.makeSucceededFuture(CircuitLimiter.decision(cap, limits: circuitLimiter.limits))
        }
        return decide(service: service, device: device, stream: stream, resuming: gateway).map { decision in
            ControllerMetrics.dialDuration.recordNanoseconds(Int64((ContinuousClock.now - started).nanoseconds))
            if case .refuse(_, let code, _) = decision { ControllerMetrics.refusal(code) }
            return decision
        }
    }

    private func decide(service: String, device: IdentityRecord, stream: any Channel, resuming gateway: String?)
        -> EventLoopFuture<CircuitDecision>
    {
        let eventLoop = stream.eventLoop
        // The connection was authenticated when it was made; the identity may have been revoked, disabled, deleted
        // or re-certified since. Every circuit is checked against the directory as it is now (memory, kept current
        // from the store), and refused with the reason a new connection would get.
        do {
            _ = try controller.activeIdentity(id: device.id, fingerprint: device.certificateFingerprint)
        } catch {
            let blocked = error.code == .permissionDenied
            return eventLoop.makeSucceededFuture(
                .refuse(
                    status: blocked ? 403 : 500,
                    code: blocked ? "identity_blocked" : "internal_error",
                    reason: error.reason
                )
            )
        }
        guard let policy = controller.state.identities.service(named: service) else {
            return eventLoop.makeSucceededFuture(
                .refuse(status: 404, code: "unknown_service", reason: "there is no service named '\(service)'")
            )
        }
        // The record as it is now, not as it was when the device connected: attributes may have changed since.
        let current = controller.state.identities.identity(id: device.id) ?? device
        guard policy.dial.allows(current) else {
            controller.state.auditQueue.append(
                actor: device.name,
                action: "dial.refused",
                target: service,
                detail: "policy=\(policy.dial.description)"
            )
            return eventLoop.makeSucceededFuture(Self.dialDenied(device: device, service: service))
        }
        if !live.isGranted(device.id, service: service) {
            // The gateways were last sent a grant without this device: the directory learned of it in a way that
            // sends none (a read on demand, a reload after a missed notification). Send the grant as it is now; the
            // circuit's stream follows it on every link, so the gateway decides with it.
            PolicyEnforcement(controller: controller, relay: self, live: live, logger: logger).enforce(named: service)
        }
        var hosts = candidates(for: service, near: stream.eventLoop)
        if let gateway {
            // A resumption goes to the gateway that holds the circuit, on any of its links: the gateway, not the
            // link, holds it. The relay keeps nothing of the circuit; the device names the gateway.
            hosts = hosts.filter { $0.identity.id == gateway }
            guard !hosts.isEmpty else {
                return eventLoop.makeSucceededFuture(unroutableResumption(gateway: gateway, service: policy))
            }
        }
        guard !hosts.isEmpty else {
            return eventLoop.makeSucceededFuture(
                .refuse(status: 503, code: "service_unavailable", reason: "no gateway hosts '\(service)' right now")
            )
        }
        return attempt(hosts[...], service: service, device: device, deviceStream: stream, resuming: gateway)
    }

    /// The answer to a resumption whose gateway has no link here for the service. A gateway that may come back
    /// (an active gateway identity the service's bind policy allows: it restarts, or links again after a network
    /// change) is `gateway_unavailable`, which the device tries again within its grace window. Any other (no such
    /// identity, not a gateway, revoked or disabled, one that may not host this service, or one linked here for
    /// another service) never will hold the circuit: `no_such_gateway`, which the device takes as final at once instead of retrying it for the whole
    /// window (issue 49: a RESUME naming another service's gateway was retried for 60 s).
    ///
    /// A gateway linked here for another service only is a process hosting that service (a gateway process hosts one,
    /// `serve --service`): whatever held the circuit is gone from it.
    func unroutableResumption(gateway id: String, service policy: ServiceRecord) -> CircuitDecision {
        let state = controller.state
        let hostsOther = self.state.withLockedValue { relay in
            relay.hosts.contains { service, hosts in
                service != policy.name && hosts.contains { $0.identity.id == id }
            }
        }
        if !hostsOther, let record = state.identities.identity(id: id), record.role == .gateway,
            (state.unsavedBlocks.block(id: id)?.state ?? record.state) == .active, policy.bind.allows(record)
        {
            return .refuse(
                status: 503,
                code: "gateway_unavailable",
                reason: "the gateway holding the circuit is not linked to this controller right now"
            )
        }
        return .refuse(
            status: 404,
            code: "no_such_gateway",
            reason: "no gateway of '\(policy.name)' by that id can hold the circuit"
        )
    }

    /// The device reset its stream before the circuit was open (nobody reads this answer).
    private struct DeviceGone: Error {}
    static let deviceGone = CircuitDecision.refuse(
        status: 499,
        code: "closed",
        reason: "the device closed the circuit before it was open"
    )

    static func dialDenied(device: IdentityRecord, service: String) -> CircuitDecision {
        .refuse(
            status: 403,
            code: "dial_denied",
            reason: "identity '\(device.name)' (role \(device.role.rawValue)) may not dial '\(service)'"
        )
    }

    /// Whether the service's dial policy, as the directory holds it now, still allows the device.
    private func stillAllowed(device: IdentityRecord, service: String) -> Bool {
        let directory = controller.state.identities
        guard let policy = directory.service(named: service) else { return false }
        return policy.dial.allows(directory.identity(id: device.id) ?? device)
    }

    /// Whether a hosting link may take a new circuit: its gateway must still be active and the link must have been
    /// made with the gateway's current certificate. A link made with a certificate that `renew` or `reissue` has since
    /// replaced gets no circuit: it may be a copy of the old identity file still running somewhere (it used to get half
    /// of the circuits after a renewal). It is not cut while it carries circuits, since it is also what the gateway
    /// that renewed uses until it has re-linked with its new certificate and drained the old links; once it carries
    /// none it is closed, and a process holding only the old certificate cannot link again.
    private func hostIsCurrent(_ host: Host) -> Bool {
        do {
            _ = try controller.activeIdentity(id: host.identity.id, fingerprint: host.identity.certificateFingerprint)
            return true
        } catch {
            let idle = state.withLockedValue { state in
                let idle = !state.sessions.values.contains { $0.host == host.key }
                if !idle { state.superseded.insert(host.key) }
                return idle
            }
            logger.notice(
                "gateway link's certificate is no longer current; not routing to it",
                metadata: [
                    "gateway": "\(host.identity.name)", "reason": "\(error.reason)",
                    "action": "\(idle ? "closed" : "draining")",
                ]
            )
            if idle { host.channel.close(promise: nil) }
            return false
        }
    }

    /// Tries each gateway in turn; a gateway that fails or refuses is skipped before the device sees an error.
    private func attempt(
        _ hosts: ArraySlice<Host>,
        service: String,
        device: IdentityRecord,
        deviceStream: any Channel,
        resuming gateway: String? = nil
    ) -> EventLoopFuture<CircuitDecision> {
        guard let host = hosts.first else {
            return deviceStream.eventLoop.makeSucceededFuture(
                .refuse(status: 502, code: "gateway_failed", reason: "no gateway for '\(service)' accepted the circuit")
            )
        }
        // A device that reset its stream while the relay was asking a gateway wants nothing any more: ask no other.
        guard deviceStream.isActive else { return deviceStream.eventLoop.makeSucceededFuture(Self.deviceGone) }
        guard hostIsCurrent(host) else {
            return attempt(
                hosts.dropFirst(),
                service: service,
                device: device,
                deviceStream: deviceStream,
                resuming: gateway
            )
        }
        let opened = host.channel.eventLoop.makePromise(of: Void.self)
        let timeout = host.channel.eventLoop.scheduleTask(in: gatewayTimeout) {
            opened.fail(CircuitRefused(code: "timeout", reason: "the gateway did not answer"))
        }
        let gatewayStream = host.multiplexer.createStreamChannel { channel in
            channel.eventLoop.makeCompletedFuture {
                try channel.pipeline.syncOperations.addHandler(
                    CircuitDialer(
                        service: service,
                        extraHeaders: [(FabricProtocol.deviceNameHeader, device.name)]
                            + (gateway.map {
                                [(FabricProtocol.resumeHeader, $0), (FabricProtocol.deviceIDHeader, device.id)]
                            } ?? []),
                        opened: opened
                    )
                )
            }
        }
        // A stream that could not be made (the gateway connection is closing) never answers: fail `opened` now.
        gatewayStream.whenFailure { opened.fail($0) }
        // Nor is an answer waited for once the device has reset its stream (a HEADERS then RST_STREAM): the gateway's
        // stream is closed at once below, instead of living until the gateway's handshake timeout on the link.
        deviceStream.closeFuture.whenComplete { _ in opened.fail(DeviceGone()) }
        let logger = self.logger
        let sessionState = self.state
        return gatewayStream.and(opened.futureResult).flatMap { gatewayStream, _ -> EventLoopFuture<CircuitDecision> in
            timeout.cancel()
            let session = SessionEntry(
                info: ControllerAPI.Session(
                    id: UUID().uuidString.lowercased(),
                    device: device.name,
                    deviceID: device.id,
                    service: service,
                    gateway: host.identity.name,
                    startedAt: Int64(Date().timeIntervalSince1970),
                    bytesFromDevice: 0,
                    bytesToDevice: 0,
                    controller: self.controller.state.address.description
                ),
                host: host.key,
                deviceStream: deviceStream
            )
            let key = ObjectIdentifier(deviceStream)
            let sameLoop = gatewayStream.eventLoop === deviceStream.eventLoop
            // The policy is asked again under the sessions' lock: a change applied while the gateway was answering
            // either finds this session in `cut`, or is seen here.
            // A device stream that closed meanwhile (a HEADERS then RST_STREAM) gets no splice: its gateway stream is
            // closed now instead of living until the gateway's handshake timeout, one per reset, on the link.
            guard deviceStream.isActive else {
                gatewayStream.close(promise: nil)
                return gatewayStream.eventLoop.makeSucceededFuture(Self.deviceGone)
            }
            let spliced = sessionState.withLockedValue { state -> Bool in
                guard self.stillAllowed(device: device, service: service) else { return false }
                state.sessions[key] = session
                if sameLoop { state.sameLoopSplices += 1 } else { state.crossLoopSplices += 1 }
                return true
            }
            guard spliced else {
                gatewayStream.close(promise: nil)
                return gatewayStream.eventLoop.makeSucceededFuture(Self.dialDenied(device: device, service: service))
            }
            ControllerMetrics.splice(sameLoop: sameLoop)
            ControllerMetrics.circuitsTotal.increment()
            ControllerMetrics.circuitsActive.increment()
            deviceStream.closeFuture.whenComplete { _ in
                let drained = sessionState.withLockedValue { state -> Bool in
                    state.sessions.removeValue(forKey: key)
                    guard state.superseded.contains(host.key),
                        !state.sessions.values.contains(where: { $0.host == host.key })
                    else { return false }
                    state.superseded.remove(host.key)
                    return true
                }
                if drained { host.channel.close(promise: nil) }
                ControllerMetrics.circuitsActive.decrement()
            }
            return gatewayStream.eventLoop.makeCompletedFuture {
                try gatewayStream.pipeline.syncOperations.addHandler(
                    RelayHandler(
                        partner: deviceStream,
                        onBytes: { bytes in session.counters.withLockedValue { $0.down += bytes } },
                        isSevered: { session.severed.withLockedValue { $0 } }
                    )
                )
            }.map {
                .accept(install: { pipeline in
                    try pipeline.addHandler(
                        RelayHandler(partner: gatewayStream) { bytes in
                            session.counters.withLockedValue { $0.up += bytes }
                            ControllerMetrics.bytesFromDevice.increment(by: bytes)
                        }
                    )
                })
            }
        }.flatMapError { error in
            timeout.cancel()
            // A gateway that lets a circuit go unanswered may be behind a link the network dropped without a word:
            // ask the link's keepalive to check it now instead of at its next interval, so the relay stops routing
            // to a dead link after one lost circuit (plus the keepalive timeout), not after many.
            if let refused = error as? CircuitRefused, refused.code == "timeout" {
                host.channel.triggerUserOutboundEvent(FabricKeepalive.Probe(), promise: nil)
            }
            // A gateway that answers after the timeout must not keep a stream nobody relays (nor its end of the
            // circuit): close it. A refused or failed stream is closed already; closing again does nothing.
            gatewayStream.whenSuccess { $0.close(promise: nil) }
            if error is DeviceGone { return deviceStream.eventLoop.makeSucceededFuture(Self.deviceGone) }
            // One line per link per interval, with the count: a device's flood must not become a flood of lines.
            if let count = self.untaken.record(key: host.key) {
                logger.notice(
                    "gateway did not take a circuit; trying the next",
                    metadata: [
                        "gateway": "\(host.identity.name)", "error": "\(error)",
                        "since_last_line": "\(count)",
                    ]
                )
            }
            return self.attempt(
                hosts.dropFirst(),
                service: service,
                device: device,
                deviceStream: deviceStream,
                resuming: gateway
            )
        }.hop(to: deviceStream.eventLoop)
    }
}

extension Duration {
    var nanoseconds: Double {
        Double(components.seconds) * 1e9 + Double(components.attoseconds) / 1e9
    }
}
