import Foundation
public import ILSCore
import ILSCrypto
import ILSSplice
public import NIOCore
import NIOPosix
import NIOSSL
import NIOTLS

/// An enrolled identity's way into the overlay: one mTLS connection to the controller, with the ALPN that says
/// what it is for. The controller is trusted only through the CA in the identity file, and must present a
/// certificate for the host in the identity's controller URL.
public struct FabricConnector: Sendable {
    public let address: ControllerAddress
    private let sslContext: NIOSSLContext

    /// - Parameter address: the controller replica to dial; the identity file's `controller` when nil. Any replica
    ///   is trusted the same way: through the identity file's CA, for the host in its own address.
    public init(identity: IdentityFile, alpn: String, address: ControllerAddress? = nil) throws(ILSError) {
        try self.init(identity: identity, alpns: [alpn], address: address)
    }

    /// - Parameter alpns: what the connection may be for, in the order this end prefers (the controller chooses).
    public init(identity: IdentityFile, alpns: [String], address: ControllerAddress? = nil) throws(ILSError) {
        try IdentityValidity.check(identity)
        if let address {
            self.address = address
        } else {
            self.address = try ControllerAddress(parsing: identity.controller)
        }
        do {
            var configuration = TLSConfiguration.makeClientConfiguration()
            configuration.minimumTLSVersion = .tlsv12
            configuration.trustRoots = .certificates(
                try NIOSSLCertificate.fromPEMBytes(Array(identity.caCertificate.utf8))
            )
            configuration.certificateChain = try NIOSSLCertificate.fromPEMBytes(Array(identity.certificate.utf8))
                .map { .certificate($0) }
            configuration.privateKey = .privateKey(
                try NIOSSLPrivateKey(bytes: Array(identity.privateKey.utf8), format: .pem)
            )
            configuration.signingSignatureAlgorithms = [.ed25519]
            configuration.applicationProtocols = alpns
            sslContext = try NIOSSLContext(configuration: configuration)
        } catch {
            throw ILSError(
                .invalidInput,
                "the identity file's certificate or key could not be loaded",
                detail: "\(error)"
            )
        }
        self.alpns = alpns
    }

    private let alpns: [String]

    /// How long a connection's setup may take, TCP and TLS together, before the connector gives up on that controller
    /// (and the dialer tries the next one). A controller that accepts TCP but never answers TLS (stopped with
    /// SIGSTOP, overloaded: its kernel still completes TCP's handshake) held the dialer until TCP itself gave up.
    public static let setupTimeout: TimeAmount = .seconds(10)

    /// Connects on `eventLoop`; after the TLS handshake agreed on our ALPN, `configure` sets up the connection.
    public func connect(
        on eventLoop: any EventLoop,
        timeout: TimeAmount = .seconds(5),
        configure: @escaping @Sendable (any Channel) throws -> Void
    ) -> EventLoopFuture<any Channel> {
        connect(on: eventLoop, timeout: timeout) { channel, _ in try configure(channel) }
    }

    /// Connects on `eventLoop`; after the TLS handshake agreed on one of our ALPNs, `configure` sets up the
    /// connection, told which. `timeout` bounds TCP's connect, `setupTimeout` the whole setup up to `configure`.
    public func connect(
        on eventLoop: any EventLoop,
        timeout: TimeAmount = .seconds(5),
        setupTimeout: TimeAmount = FabricConnector.setupTimeout,
        configure: @escaping @Sendable (any Channel, _ alpn: String) throws -> Void
    ) -> EventLoopFuture<any Channel> {
        let sslContext = self.sslContext
        let host = address.host
        let alpns = self.alpns
        let ready = eventLoop.makePromise(of: Void.self)
        let expiry = eventLoop.scheduleTask(in: setupTimeout) {
            ready.fail(
                ILSError(
                    .unavailable,
                    "the controller did not finish the connection's TLS handshake within "
                        + "\(setupTimeout.nanoseconds / 1_000_000) ms"
                )
            )
        }
        ready.futureResult.whenComplete { _ in expiry.cancel() }
        let connected = ClientBootstrap(group: eventLoop)
            .connectTimeout(timeout)
            .channelOption(.tcpOption(.tcp_nodelay), value: 1)
            .channelOption(.writeBufferWaterMark, value: WriteBuffers.overlayConnection)
            .channelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    let hostname = ServerChainVerification.isIPAddress(host) ? nil : host
                    try channel.pipeline.syncOperations.addHandler(
                        NIOSSLClientHandler(context: sslContext, serverHostname: hostname)
                    )
                    try channel.pipeline.syncOperations.addHandler(
                        ApplicationProtocolNegotiationHandler { result, channel in
                            guard case .negotiated(let chosen) = result, alpns.contains(chosen) else {
                                ready.fail(
                                    ILSError(
                                        .unavailable,
                                        "the controller does not speak \(alpns.joined(separator: " or "))"
                                    )
                                )
                                return channel.close()
                            }
                            return channel.eventLoop.makeCompletedFuture {
                                try configure(channel, chosen)
                                ready.succeed()
                            }
                        }
                    )
                }
            }
            .connect(host: address.host, port: address.port)
        connected.whenFailure { ready.fail($0) }
        connected.whenSuccess { channel in
            channel.closeFuture.whenComplete { _ in
                ready.fail(ILSError(.unavailable, "the controller closed the connection during setup"))
            }
            // A setup that failed or ran out of time leaves no connection behind.
            ready.futureResult.whenFailure { _ in channel.close(promise: nil) }
        }
        return connected.and(ready.futureResult).map { channel, _ in channel }
    }
}

/// Jittered exponential backoff for reconnecting: 100 ms doubling to a cap, each wait drawn uniformly from
/// [step/2, step] of the current step so a fleet of gateways does not reconnect in lockstep.
public struct Backoff: Sendable {
    public var initial: TimeAmount = .milliseconds(100)
    public var maximum: TimeAmount
    private var attempt = 0

    /// The cap for reconnecting to the controller: a gateway must carry traffic again within a second of the
    /// controller coming back, however long it was away, so it tries at least every 800 ms (every 400–800 ms once
    /// the steps reach the cap: a refused TCP connection or a refused handshake each time, which the controller
    /// barely notices).
    public static let reconnectMaximum: TimeAmount = .milliseconds(800)

    public init(initial: TimeAmount = .milliseconds(100), maximum: TimeAmount = reconnectMaximum) {
        self.initial = initial
        self.maximum = maximum
    }

    public mutating func next() -> TimeAmount {
        let step = min(maximum.nanoseconds, initial.nanoseconds << min(attempt, 20))
        attempt += 1
        return .nanoseconds(Int64.random(in: (step / 2)...max(step / 2, step)))
    }

    public mutating func reset() { attempt = 0 }
}

/// How long a gateway's link to the controller waits before it dials again, by how the last one ended; the overlay
/// gateway's links and HTTP mode's policy link share it.
///
/// The connect backoff starts over only once the controller has accepted a binding, not when TLS connects: a revoked
/// gateway's handshake still succeeds, and resetting there made it reconnect about 12 times a second forever. A
/// refusal of the identity itself (`identity_blocked`: revoked, disabled, deleted, certificate replaced) does not
/// heal by itself: 30 s doubling to 5 min. A refusal of the service (no such service, bind policy) may be an admin's
/// work in progress: 5 s doubling to 1 min.
public struct LinkBackoff: Sendable {
    private var connect = Backoff()
    private var identityRefused = Backoff(initial: .seconds(30), maximum: .seconds(300))
    private var serviceRefused = Backoff(initial: .seconds(5), maximum: .seconds(60))

    public init() {}

    /// The controller accepted a link's binding: every wait starts over.
    public mutating func bound() {
        connect.reset()
        identityRefused.reset()
        serviceRefused.reset()
    }

    /// The wait after the controller refused the binding with `code` (`HostControlMessage.errorCode`).
    public mutating func refused(code: String?) -> TimeAmount {
        code == HostControlMessage.identityBlocked ? identityRefused.next() : serviceRefused.next()
    }

    /// The wait after a connection failed, or closed without a refusal.
    public mutating func failed() -> TimeAmount { connect.next() }
}
