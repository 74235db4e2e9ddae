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
    private let connector: FabricConnector
    private let credentials: E2EHandshake.Credentials
    private let connection = NIOLockedValueBox<EventLoopFuture<NIOHTTP2Handler.StreamMultiplexer>?>(nil)

    public init(identity: IdentityFile, eventLoop: any EventLoop = MultiThreadedEventLoopGroup.singleton.next())
        throws(ILSError)
    {
        self.eventLoop = eventLoop
        self.connector = try FabricConnector(identity: identity, alpn: FabricProtocol.dialALPN)
        self.credentials = try E2EHandshake.Credentials(
            certificatePEM: identity.certificate,
            privateKeyPEM: identity.privateKey,
            caCertificatePEM: identity.caCertificate
        )
    }

    /// The live connection's multiplexer, connecting if there is none.
    private func multiplexer() -> EventLoopFuture<NIOHTTP2Handler.StreamMultiplexer> {
        connection.withLockedValue { existing in
            if let existing { return existing }
            let promise = eventLoop.makePromise(of: NIOHTTP2Handler.StreamMultiplexer.self)
            let box = self.connection
            connector.connect(on: eventLoop) { channel in
                let multiplexer = try channel.pipeline.syncOperations.configureHTTP2Pipeline(
                    mode: .client,
                    connectionConfiguration: FabricSettings.connection,
                    streamConfiguration: FabricSettings.stream
                ) { stream in stream.close() }
                promise.succeed(multiplexer)
                channel.closeFuture.whenComplete { _ in
                    box.withLockedValue { $0 = nil }
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
        let credentials = self.credentials
        let address = connector.address
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
            return stream.and(opened.futureResult).flatMapThrowing { stream, _ in
                let pipeline = stream.pipeline.syncOperations
                try pipeline.addHandler(StreamDataCodec())
                try pipeline.addHandler(ByteToMessageHandler(FrameDecoder()))
                try pipeline.addHandler(MessageToByteHandler(FrameEncoder()))
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
