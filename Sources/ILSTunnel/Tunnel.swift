public import ILSCore
import ILSDial
public import ILSFabric
import ILSIdentity
import ILSSplice
public import Logging
import NIOConcurrencyHelpers
public import NIOCore
import NIOHTTP2
import NIOPosix
public import ServiceLifecycle

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// `ils-gateway tunnel`: a loopback listener on the device; every accepted TCP connection becomes an end-to-end
/// encrypted circuit to the service, so clients that don't speak the overlay (curl, a browser, an app configured
/// with `http://127.0.0.1:PORT`) use it unchanged.
public final class Tunnel: Service, Sendable {
    private let dialer: OverlayDialer
    private let service: String
    private let listen: HostPort
    private let logger: Logger
    private let channel = NIOLockedValueBox<(any Channel)?>(nil)
    /// Renews the certificate when due and notices one renewed in the identity file by someone else.
    private let keeper: IdentityKeeper?
    /// Which requests may go into a circuit: the device's programs, not web pages (`TunnelSitePolicy`).
    private let policy: TunnelSitePolicy
    private let refusals: TunnelRefusalLog

    /// Refuses a non-loopback listen address unless `allowRemote`: anyone who can reach the tunnel's port uses the
    /// device's identity.
    /// - Parameters:
    ///   - identityPath: the identity file, so the tunnel renews its certificate by itself before expiry.
    ///   - allowedHosts: `Host` names answered besides loopback, the listen address and the service's name.
    ///   - allowedOrigins: web origins (`http://localhost:3000`) whose pages may send requests.
    public init(
        identity: IdentityFile,
        identityPath: String? = nil,
        service: String,
        listen: HostPort,
        allowRemote: Bool,
        allowedHosts: [String] = [],
        allowedOrigins: [String] = [],
        keepalive: FabricKeepalive = .standard,
        idle: FabricKeepalive.Idle = .standard,
        retention: CircuitRetention = .standard,
        logger: Logger
    ) throws(ILSError) {
        try TunnelSitePolicy.validate(allowedHosts: allowedHosts, allowedOrigins: allowedOrigins)
        guard listen.isLoopback || allowRemote else {
            throw ILSError(
                .invalidArgument,
                "the tunnel listens on loopback only (anyone reaching it acts as '\(identity.identity.name)'); "
                    + "give --allow-remote to listen on \(listen.host)"
            )
        }
        self.dialer = try OverlayDialer(identity: identity, keepalive: keepalive, idle: idle, retention: retention)
        self.keeper = identityPath.map { IdentityKeeper(path: $0, current: identity) }
        if let identityPath {
            // The cluster's controllers, as circuit answers name them, go into the identity file: the next start
            // fails over to a replica that joined after enrollment.
            dialer.onControllersLearned { learned in
                IdentityFileIO.learn(  // already off the event loop, in order (`onControllersLearned`)
                    ControllerAddress.replicas(learned.controllers),
                    path: identityPath,
                    certificate: learned.certificate
                )
            }
        }
        self.service = service
        self.listen = listen
        self.logger = logger
        self.policy = TunnelSitePolicy(
            listenHost: listen.host,
            service: service,
            allowedHosts: allowedHosts,
            allowedOrigins: allowedOrigins
        )
        self.refusals = TunnelRefusalLog(logger: logger)
    }

    /// Binds the listener (on the dialer's event loop, so each accepted socket and its circuit share a thread).
    public func start() async throws(ILSError) -> SocketAddress {
        let dialer = self.dialer
        let service = self.service
        let logger = self.logger
        let policy = self.policy
        let refusals = self.refusals
        let listener: any Channel
        do {
            listener = try await ServerBootstrap(group: dialer.eventLoop)
                .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
                .childChannelOption(.tcpOption(.tcp_nodelay), value: 1)
                .childChannelOption(.writeBufferWaterMark, value: WriteBuffers.localConnection)
                .childChannelInitializer { channel in
                    channel.eventLoop.makeCompletedFuture {
                        try channel.pipeline.syncOperations.addHandlers(
                            TunnelRequestGuard(policy: policy, refusals: refusals),
                            TunnelConnectionHandler(dialer: dialer, service: service, logger: logger)
                        )
                    }
                }
                .bind(host: listen.host, port: listen.port).get()
        } catch {
            throw ILSError(.unavailable, "could not listen on \(listen): \(error)")
        }
        channel.withLockedValue { $0 = listener }
        guard let address = listener.localAddress else { throw ILSError(.internalError, "no local address") }
        return address
    }

    public func shutdown() async {
        let listener = channel.withLockedValue { channel in
            defer { channel = nil }
            return channel
        }
        try? await listener?.close()
    }

    public func run() async throws {
        let address = try await start()
        logger.info(
            "tunnel listening",
            metadata: [
                "listen": "\(address.ipAddress ?? "?"):\(address.port ?? 0)", "service": "\(service)",
            ]
        )
        await withDiscardingTaskGroup { group in
            if let keeper = self.keeper {
                group.addTask { await keeper.run { self.adopt($0) } }
            }
            group.addTask {
                // The refusal counts of each minute, written when it ends.
                // Sleep: the once-a-minute summary is a schedule, not a wait for an event.
                while (try? await Task.sleep(for: .seconds(60))) != nil { self.refusals.drain() }
            }
            try? await gracefulShutdown()
            group.cancelAll()
        }
        await shutdown()
    }

    /// Renews the certificate now and dials with the new one from the next circuit on.
    public func renewNow(path: String) async throws(ILSError) {
        let renewed = try await Renewal.renew(path: path)
        keeper?.adopted(renewed)
        _ = adopt(.renewed(renewed))
    }

    /// Dials with a renewed certificate (renewed here when due, or by someone else in the identity file) from the next
    /// circuit on: the controller refuses circuits on a connection made with a replaced one.
    private func adopt(_ change: IdentityKeeper.Change) -> Bool {
        switch change {
        case .renewed(let file), .changedOnDisk(let file):
            do {
                try dialer.replaceIdentity(file)
            } catch {
                logger.warning("the new certificate cannot be used", metadata: ["error": "\(error.reason)"])
                return false
            }
            logger.info(
                "certificate renewed; dialling with it",
                metadata: ["until": "\(file.identity.certificateNotAfter ?? 0)"]
            )
            return true
        case .renewalFailed(let error):
            logger.warning("certificate renewal failed; will retry", metadata: ["error": "\(error.reason)"])
            return false
        }
    }
}

/// Dials the circuit when the first checked request arrives (`TunnelRequestGuard` sits before it), holds what
/// follows until the circuit is open, then glues the two together. A connection that sends nothing costs no circuit. A
/// circuit that cannot be opened is logged in one line and the client is answered with the reason at once (never left
/// hanging).
final class TunnelConnectionHandler: ChannelDuplexHandler, RemovableChannelHandler {
    typealias InboundIn = ByteBuffer
    typealias InboundOut = ByteBuffer
    typealias OutboundIn = ByteBuffer

    private enum State {
        case idle
        /// The first request arrived; what the client sent is held until the circuit is open.
        case dialling(held: [ByteBuffer])
        /// The circuit was refused and the client answered: it is now only waited on to hang up.
        case refused
    }

    private let dialer: OverlayDialer
    private let service: String
    private let logger: Logger
    private var state = State.idle
    private var pendingRead = false

    init(dialer: OverlayDialer, service: String, logger: Logger) {
        self.dialer = dialer
        self.service = service
        self.logger = logger
    }

    func channelActive(context: ChannelHandlerContext) {
        context.fireChannelActive()
        TunnelMetrics.connections.increment()
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        switch state {
        case .idle:
            state = .dialling(held: [unwrapInboundIn(data)])
            dial(context: context)
        case .dialling(var held):
            held.append(unwrapInboundIn(data))
            state = .dialling(held: held)
        case .refused:
            // After a refusal what the client still sends is dropped.
            break
        }
    }

    private func dial(context: ChannelHandlerContext) {
        let channel = context.channel
        let logger = self.logger
        let service = self.service
        dialer.dial(service: service).hop(to: context.eventLoop).assumeIsolated().whenComplete { result in
            switch result {
            case .success(let stream):
                guard channel.isActive, case .dialling(let held) = self.state else {
                    stream.close(promise: nil)
                    return
                }
                let (local, remote) = GlueHandler.matchedPair()
                do {
                    try stream.pipeline.syncOperations.addHandler(CircuitErrorLogger(logger: logger, client: channel))
                    try stream.pipeline.syncOperations.addHandler(remote)
                    try context.pipeline.syncOperations.addHandler(local, position: .after(self))
                } catch {
                    stream.close(promise: nil)
                    channel.close(promise: nil)
                    return
                }
                self.state = .idle
                for bytes in held { context.fireChannelRead(self.wrapInboundOut(bytes)) }
                context.fireChannelReadComplete()
                context.pipeline.syncOperations.removeHandler(self, promise: nil)
            case .failure(let error):
                TunnelMetrics.failures.increment()
                logger.warning(
                    "circuit not opened; answering the client with the reason",
                    metadata: ["service": "\(service)", "error": "\(Self.describe(error))"]
                )
                self.state = .refused
                TunnelRefusal(error).send(to: channel)
                // Read on (and drop) what the client sent, so its hang-up after the answer is seen.
                if channel.isActive { context.read() }
            }
        }
    }

    func read(context: ChannelHandlerContext) {
        if case .dialling = state {
            pendingRead = true
        } else {
            context.read()
        }
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        if pendingRead { context.read() }
    }

    static func describe(_ error: any Error) -> String {
        switch error {
        case OverlayDialer.DialError.controllerUnreachable(let reason): reason
        case OverlayDialer.DialError.refused(let code, let reason): "\(reason) (\(code))"
        default: "\(error)"
        }
    }
}

/// Logs why a circuit ended badly (a gateway's end-to-end refusal, a failed record), once. A gateway's refusal comes
/// before any byte of an answer, so the client is told why in the gateway's JSON error format.
final class CircuitErrorLogger: ChannelInboundHandler {
    typealias InboundIn = ByteBuffer
    private let logger: Logger
    private let client: any Channel

    init(logger: Logger, client: any Channel) {
        self.logger = logger
        self.client = client
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        if let closed = error as? NIOHTTP2Errors.StreamClosed, closed.errorCode == .cancel {
            // Our own side closed the circuit (the client went away): not a failure.
            logger.debug("circuit closed", metadata: ["stream": "\(closed.streamID)"])
        } else if let refused = error as? E2EInitiatorHandler.Refused {
            logger.warning("the gateway refused the circuit", metadata: ["reason": "\(refused.reason)"])
            TunnelRefusal(refused).send(to: client)
        } else if let cut = error as? E2ECircuitError, cut == .truncated {
            logger.warning("circuit cut before the gateway's end; resetting the client connection")
            Self.reset(client)
        } else if let lost = error as? E2ECircuitError, lost.code == E2ECircuitError.notResumed.code {
            // The path was lost and the circuit could not be resumed: the answer did not end, so the client must not
            // read a FIN as its end.
            logger.warning(
                "circuit lost and not resumed; resetting the client connection",
                metadata: ["reason": "\(lost.reason)"]
            )
            Self.reset(client)
        } else if let refused = error as? E2ECircuitError, E2ECircuitError.refusedCodes.contains(refused.code) {
            // The controller ended it (the identity was blocked): the answer did not end either.
            logger.warning(
                "circuit ended by the controller; resetting the client connection",
                metadata: ["code": "\(refused.code)", "reason": "\(refused.reason)"]
            )
            Self.reset(client)
        } else {
            logger.warning("circuit failed", metadata: ["error": "\(error)"])
        }
        context.fireErrorCaught(error)
    }

    /// Closes the client's connection with a TCP reset (SO_LINGER 0) rather than a FIN: a FIN after a cut answer
    /// would look, to a client reading to end of file, like the answer was complete.
    static func reset(_ client: any Channel) {
        guard let socket = client as? any SocketOptionProvider else {
            client.close(promise: nil)
            return
        }
        socket.setSoLinger(linger(l_onoff: 1, l_linger: 0)).whenComplete { _ in client.close(promise: nil) }
    }
}
