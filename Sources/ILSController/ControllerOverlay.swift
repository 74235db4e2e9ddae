import Foundation
import ILSCore
import ILSCrypto
import ILSFabric
import Logging
import NIOCore
import NIOHPACK
import NIOHTTP2
import NIOSSL

/// Sets up the overlay connections that arrive on the controller's port: devices (`ils-dial/1`) and gateways
/// (`ils-host/1`). Both must present an enrolled identity's current certificate.
struct ControllerOverlay: Sendable {
    let controller: Controller
    let relay: Relay
    let live: LiveConnections
    /// The controller's event loops, numbered: each gateway connection is told which one it is on.
    let loops: RelayLoops
    /// How each overlay connection notices a peer that is gone without a word (a NAT mapping dropped).
    let keepalive: FabricKeepalive
    let logger: Logger
    /// "Overlay connection refused", at most once a minute per reason (which names the identity and why) with the
    /// count: a disabled device's tunnel that redials made 357 lines in 22 s (issue 49).
    let refusedLog = LogTally<String>(interval: .seconds(60))

    /// Logs a refused overlay connection (`refusedLog`).
    private func logRefused(_ error: ILSError) {
        guard let count = refusedLog.record(key: error.reason) else { return }
        logger.notice(
            "overlay connection refused (once a minute per reason)",
            metadata: ["reason": "\(error.reason)", "since_last_line": "\(count)"]
        )
    }

    private static func peerCertificate(_ channel: any Channel) -> [UInt8]? {
        try? channel.pipeline.syncOperations.handler(type: NIOSSLServerHandler.self).peerCertificate?.toDERBytes()
    }

    /// Runs `configure` once the directory knows the peer's certificate: at once when it does (every connection but
    /// the first of a device enrolled or renewed through another controller a moment ago), after one bounded store
    /// read when not (`Controller.learnIfUnknown`). Bytes that arrive meanwhile wait in the ALPN handler.
    func afterLearning(_ channel: any Channel, _ configure: @escaping @Sendable () throws -> Void)
        -> EventLoopFuture<Void>
    {
        let certificate = Self.peerCertificate(channel)
        guard controller.directoryMisses(certificateDER: certificate) != nil else {
            return channel.eventLoop.makeCompletedFuture { try configure() }
        }
        let controller = self.controller
        let learned = channel.eventLoop.makePromise(of: Void.self)
        learned.completeWithTask { await controller.learnIfUnknown(certificateDER: certificate) }
        return learned.futureResult.flatMapThrowing { try configure() }
    }

    private func identity(of channel: any Channel, purpose: String) throws(ILSError) -> IdentityRecord {
        let certificate = Self.peerCertificate(channel)
        guard let certificate else {
            throw ILSError(.permissionDenied, "\(purpose) needs an enrolled identity's client certificate")
        }
        let presented = try IdentityCertificate(der: certificate)
        return try controller.authenticate(certificateDER: certificate, role: presented.role, purpose: purpose)
    }

    /// Closes a connection whose peer stopped answering, so the relay stops routing to it at once (a gateway link) and
    /// its circuits end instead of hanging.
    private func keepaliveHandler(peer: String) -> KeepaliveHandler {
        KeepaliveHandler(keepalive) { [logger] in
            logger.notice(
                "overlay connection went silent (no answer to a keepalive PING); closing it",
                metadata: ["peer": "\(peer)"]
            )
        }
    }

    /// Closes an overlay connection on a connection-level error, so the peer reconnects.
    private func connectionErrorHandler(peer: String) -> FabricConnectionErrorHandler {
        FabricConnectionErrorHandler { [logger] error in
            logger.notice("overlay connection failed; closing it", metadata: ["peer": "\(peer)", "error": "\(error)"])
        }
    }

    /// A device connection: HTTP/2 server; each stream is a circuit request, which may bring up to `earlyData`
    /// bytes of its first DATA before its answer (`ils-dial/2`).
    func configureDevice(_ channel: any Channel, earlyData: Int = 0) throws {
        let device: IdentityRecord
        do {
            device = try identity(of: channel, purpose: "dialing a service")
        } catch {
            ControllerMetrics.refusal(error.code.name)
            logRefused(error)
            if Self.presentedCertificate(channel) {
                try refuseCircuits(on: channel, reason: error.reason)
            } else {
                channel.close(promise: nil)
            }
            return
        }
        let relay = self.relay
        let roster = controller.state.roster
        live.add(channel, identityID: device.id)
        ControllerMetrics.deviceConnections.increment()
        channel.closeFuture.whenComplete { _ in ControllerMetrics.deviceConnections.decrement() }
        try channel.pipeline.syncOperations.configureFabricHTTP2(
            mode: .server,
            keepalive: keepaliveHandler(peer: device.name),
            // A device's stack queues circuits beyond its identity's cap instead of asking for them; gateway links
            // keep the fabric's default, since every device's circuits to a service share them.
            maxConcurrentStreams: relay.circuitLimiter.limits.concurrent
        ) {
            CircuitAcceptor(earlyData: earlyData, answerHeaders: { Self.clusterHeader(roster) }) {
                service,
                headers,
                stream in
                relay.dial(
                    service: service,
                    device: device,
                    stream: stream,
                    resuming: headers.first(name: FabricProtocol.resumeHeader)
                )
            }
        }
        try channel.pipeline.syncOperations.addHandler(connectionErrorHandler(peer: device.name))
        logger.info("device connected", metadata: ["identity": "\(device.name)"])
    }

    /// The cluster's controllers on a device's circuit answers, so a device enrolled before a replica existed learns
    /// it on its first circuit (none before the list was first read from the store: `ControllerRoster.announced`).
    private static func clusterHeader(_ roster: ControllerRoster) -> [(String, String)] {
        roster.announced.map { [(ControllerAddress.listHeader, ControllerAddress.header($0))] } ?? []
    }

    /// Whether the peer presented a certificate (TLS verified it against the CA: one this controller issued).
    private static func presentedCertificate(_ channel: any Channel) -> Bool {
        (try? channel.pipeline.syncOperations.handler(type: NIOSSLServerHandler.self).peerCertificate) != nil
    }

    /// How long a refused device connection stays open for the device to ask for a circuit and read why not.
    static let refusalGrace: TimeAmount = .seconds(2)

    /// A device connection with a certificate this controller issued whose identity may not dial (revoked,
    /// disabled, deleted, re-certified, another role): its first circuit request is answered `403 identity_blocked` with the reason, so the
    /// device can tell its user why, then the connection closes; it closes after `refusalGrace` in any case. No
    /// circuit is ever relayed on it.
    private func refuseCircuits(on channel: any Channel, reason: String) throws {
        let closer = channel.eventLoop.scheduleTask(in: Self.refusalGrace) { channel.close(promise: nil) }
        channel.closeFuture.whenComplete { _ in closer.cancel() }
        try channel.pipeline.syncOperations.configureFabricHTTP2(mode: .server) {
            CircuitAcceptor { _, _, stream in
                // The refusal is written and flushed before the stream closes; the connection goes with it.
                stream.closeFuture.whenComplete { _ in channel.close(promise: nil) }
                return stream.eventLoop.makeSucceededFuture(
                    .refuse(status: 403, code: "identity_blocked", reason: reason)
                )
            }
        }
        try channel.pipeline.syncOperations.addHandler(connectionErrorHandler(peer: "refused device"))
    }

    /// A gateway link with a certificate this controller issued whose identity may not host: its control stream
    /// carries the reason (`HostRefusalHandler`), then the link closes; it closes after `refusalGrace` in any case. The
    /// gateway logs the reason once and waits minutes before it tries again.
    private func refuseHosting(on channel: any Channel, reason: String) throws {
        let closer = channel.eventLoop.scheduleTask(in: Self.refusalGrace) { channel.close(promise: nil) }
        channel.closeFuture.whenComplete { _ in closer.cancel() }
        let multiplexer = try channel.pipeline.syncOperations.configureFabricHTTP2(mode: .client)
        try channel.pipeline.syncOperations.addHandler(connectionErrorHandler(peer: "refused gateway"))
        multiplexer.createStreamChannel { stream in
            stream.eventLoop.makeCompletedFuture {
                try stream.pipeline.syncOperations.addHandler(HostRefusalHandler(reason: reason))
            }
        }.whenFailure { _ in channel.close(promise: nil) }
    }

    /// A gateway connection: HTTP/2 with the controller as client. The first stream asks what it hosts.
    func configureGateway(_ channel: any Channel) throws {
        let gateway: IdentityRecord
        do {
            gateway = try identity(of: channel, purpose: "hosting a service")
        } catch {
            ControllerMetrics.refusal(error.code.name)
            logRefused(error)
            if Self.presentedCertificate(channel) {
                try refuseHosting(on: channel, reason: error.reason)
            } else {
                channel.close(promise: nil)
            }
            return
        }
        // Gateways never open streams towards the controller.
        let multiplexer = try channel.pipeline.syncOperations.configureFabricHTTP2(
            mode: .client,
            keepalive: keepaliveHandler(peer: gateway.name)
        )
        try channel.pipeline.syncOperations.addHandler(connectionErrorHandler(peer: gateway.name))
        let controller = self.controller
        let relay = self.relay
        let live = self.live
        let link = (loop: loops.index(of: channel.eventLoop), loops: loops.count)
        live.add(channel, identityID: gateway.id)
        ControllerMetrics.gatewayConnections.increment()
        channel.closeFuture.whenComplete { _ in ControllerMetrics.gatewayConnections.decrement() }
        multiplexer.createStreamChannel { stream in
            stream.eventLoop.makeCompletedFuture {
                try stream.pipeline.syncOperations.addHandler(
                    HostControlHandler(
                        gateway: gateway,
                        controller: controller,
                        link: link,
                        // A policy-only link (an HTTP-mode gateway's) gets the pushes but never a circuit.
                        registration: .separate(
                            subscribe: { service in
                                live.addControlStream(stream, service: service, gatewayID: gateway.id)
                            },
                            host: { service in
                                relay.register(
                                    Relay.Host(
                                        key: ObjectIdentifier(channel),
                                        identity: gateway,
                                        channel: channel,
                                        multiplexer: multiplexer
                                    ),
                                    service: service
                                )
                            }
                        )
                    )
                )
            }
        }.whenFailure { _ in channel.close(promise: nil) }
    }
}
