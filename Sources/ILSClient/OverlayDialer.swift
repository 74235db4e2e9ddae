public import ILSCore
import ILSCrypto
import ILSFabric
import NIOConcurrencyHelpers
public import NIOCore
import NIOHTTP2
public import NIOPosix

/// Dials services through the overlay for an app or the tunnel: one mTLS HTTP/2 connection to the controller
/// (made on first use and again after it is lost), one stream per circuit, end-to-end encrypted to the gateway.
///
/// `dial` returns a channel that carries the app's plaintext bytes: write `ByteBuffer`s, read `ByteBuffer`s.
public final class OverlayDialer: Sendable {
    /// Why a dial failed, for a person and for code.
    public enum DialError: Error, Sendable, Equatable {
        /// The controller could not be reached.
        case controllerUnreachable(String)
        /// The controller or the gateway refused the circuit (`code` is stable, e.g. `dial_denied`,
        /// `service_unavailable`).
        case refused(code: String, reason: String)
    }

    public let eventLoop: any EventLoop
    /// The identity in use; `replaceIdentity` swaps it after a renewal (new connections and circuits use it).
    private let current: NIOLockedValueBox<(connector: FabricConnector, credentials: E2EHandshake.Credentials)>
    private let connection = NIOLockedValueBox<EventLoopFuture<NIOHTTP2Handler.StreamMultiplexer>?>(nil)

    public init(identity: IdentityFile, eventLoop: any EventLoop = MultiThreadedEventLoopGroup.singleton.next())
        throws(ILSError)
    {
        self.eventLoop = eventLoop
        self.current = NIOLockedValueBox(try Self.load(identity))
    }

    private static func load(_ identity: IdentityFile) throws(ILSError) -> (
        connector: FabricConnector, credentials: E2EHandshake.Credentials
    ) {
        (
            try FabricConnector(identity: identity, alpn: FabricProtocol.dialALPN),
            try E2EHandshake.Credentials(
                certificatePEM: identity.certificate,
                privateKeyPEM: identity.privateKey,
                caCertificatePEM: identity.caCertificate
            )
        )
    }

    /// Uses a renewed identity from now on: the next circuit opens a new controller connection with it. The old
    /// connection is left to finish the circuits it carries (the controller stops accepting new ones on it).
    public func replaceIdentity(_ identity: IdentityFile) throws(ILSError) {
        let loaded = try Self.load(identity)
        current.withLockedValue { $0 = loaded }
        connection.withLockedValue { $0 = nil }
    }

    /// The live connection's multiplexer, connecting if there is none.
    private func multiplexer() -> EventLoopFuture<NIOHTTP2Handler.StreamMultiplexer> {
        connection.withLockedValue { existing in
            if let existing { return existing }
            let promise = eventLoop.makePromise(of: NIOHTTP2Handler.StreamMultiplexer.self)
            let box = self.connection
            let connector = current.withLockedValue { $0.connector }
            connector.connect(on: eventLoop) { channel in
                let multiplexer = try channel.pipeline.syncOperations.configureFabricHTTP2(mode: .client)
                try channel.pipeline.syncOperations.addHandler(FabricConnectionErrorHandler())
                promise.succeed(multiplexer)
                let mine = promise.futureResult
                channel.closeFuture.whenComplete { _ in
                    // Forget this connection only if it is still the current one (not after a renewal swapped it).
                    box.withLockedValue { if $0 === mine { $0 = nil } }
                }
            }.whenFailure { error in
                box.withLockedValue { $0 = nil }
                promise.fail(error)
            }
            existing = promise.futureResult
            return promise.futureResult
        }
    }

    /// Opens an end-to-end encrypted circuit to `service`.
    public func dial(service: String) -> EventLoopFuture<any Channel> {
        let (credentials, address) = current.withLockedValue { ($0.credentials, $0.connector.address) }
        return multiplexer().flatMapError { error in
            self.eventLoop.makeFailedFuture(
                DialError.controllerUnreachable(
                    "cannot reach the controller at \(address): \((error as? ILSError)?.reason ?? "\(error)")"
                )
            )
        }.flatMap { multiplexer in
            let opened = self.eventLoop.makePromise(of: Void.self)
            let stream = multiplexer.createStreamChannel { stream in
                stream.eventLoop.makeCompletedFuture {
                    try stream.pipeline.syncOperations.addHandler(CircuitDialer(service: service, opened: opened))
                }
            }
            // A stream that could not be made (the connection is closing) never answers: complete `opened` too, or
            // the promise and the futures waiting on it leak.
            stream.whenFailure { opened.fail($0) }
            return stream.and(opened.futureResult).flatMapThrowing { stream, _ in
                let pipeline = stream.pipeline.syncOperations
                try pipeline.addHandler(StreamDataCodec())
                try pipeline.addHandler(ByteToMessageHandler(FrameDecoder()))
                try pipeline.addHandler(E2EInitiatorHandler(credentials: credentials, service: service))
                return stream
            }.flatMapErrorThrowing { error in
                if let refused = error as? CircuitRefused {
                    throw DialError.refused(code: refused.code, reason: refused.reason)
                }
                throw error
            }
        }
    }
}
