import ILSCore
import ILSFabric
import ILSTesting
import NIOConcurrencyHelpers
import NIOCore
import NIOPosix
import NIOSSL
import Testing

/// `FabricConnector.connect` bounds the whole setup, TCP and TLS: a controller that accepts TCP but never answers TLS
/// (stopped with SIGSTOP, whose kernel still completes TCP's handshake; overloaded) held the dialer until TCP gave
/// up, instead of letting it try the next replica. And it trusts only a controller of the identity's CA, named by
/// the address dialled.
@Suite("Connecting to a controller")
struct FabricConnectorSetupTests {
    @Test("a listener that accepts TCP and never answers TLS is given up on with its reason, and the connection closed")
    func stalledHandshakeIsBounded() async throws {
        try await withCluster { cluster in
            let identity = try await cluster.enroll("phone", role: .device)
            let group = MultiThreadedEventLoopGroup.singleton
            let acceptedClosed = group.next().makePromise(of: Void.self)
            // Accepts, never writes: the ClientHello goes unanswered.
            let mute = try await ServerBootstrap(group: group)
                .childChannelInitializer { channel in
                    channel.closeFuture.cascade(to: acceptedClosed)
                    return channel.eventLoop.makeSucceededVoidFuture()
                }
                .bind(host: "127.0.0.1", port: 0).get()
            defer { mute.close(promise: nil) }
            let port = try #require(mute.localAddress?.port)
            let connector = try FabricConnector(
                identity: identity,
                alpn: FabricProtocol.dialALPN,
                address: try ControllerAddress(parsing: "https://127.0.0.1:\(port)")
            )
            var failure: ILSError?
            do {
                _ = try await connector.connect(on: group.next(), setupTimeout: .milliseconds(300)) { _, _ in }.get()
            } catch {
                failure = error as? ILSError
            }
            let error = try #require(failure, "the connection succeeded or failed with another error")
            #expect(error.code == .unavailable)
            #expect(error.reason.contains("did not finish the connection's TLS handshake"), "\(error.reason)")
            // The connector closed its end: the listener's side ends (the event; it hangs without the bound).
            try await acceptedClosed.futureResult.get()
        }
    }

    @Test(
        "a TLS server is refused unless its chain ends in the identity's CA and names the host dialled",
        arguments: [Impostor.otherAddress, .otherCA]
    )
    func impostorIsRefused(impostor: Impostor) async throws {
        try await withCluster { cluster in
            let phone = try await cluster.enroll("phone", role: .device)
            let group = MultiThreadedEventLoopGroup.singleton
            var tls: TLSConfiguration
            switch impostor {
            case .otherAddress:
                // A controller certificate of the cluster's own CA, for 127.0.0.1 (and localhost), served on and
                // dialled at 127.0.0.2: the chain is good, the name is not.
                let issued = try cluster.state.authority.issueServerCertificate(host: "127.0.0.1")
                tls = TLSConfiguration.makeServerConfiguration(
                    certificateChain: try NIOSSLCertificate.fromPEMBytes(Array(issued.certificatePEM.utf8))
                        .map { .certificate($0) },
                    privateKey: .privateKey(
                        try NIOSSLPrivateKey(bytes: Array(issued.privateKeyPEM.utf8), format: .pem)
                    )
                )
            case .otherCA:
                // Names 127.0.0.1, from a CA the identity does not trust.
                let pki = try TestPKI()
                defer { pki.remove() }
                tls = TLSConfiguration.makeServerConfiguration(
                    certificateChain: try NIOSSLCertificate.fromPEMFile(pki.serverCertificatePath)
                        .map { .certificate($0) },
                    privateKey: .privateKey(try NIOSSLPrivateKey(file: pki.serverKeyPath, format: .pem))
                )
            }
            tls.applicationProtocols = [FabricProtocol.dialALPN]
            let host = impostor == .otherAddress ? "127.0.0.2" : "127.0.0.1"
            let context = try NIOSSLContext(configuration: tls)
            let server = try await ServerBootstrap(group: group)
                .childChannelInitializer { channel in
                    channel.eventLoop.makeCompletedFuture {
                        try channel.pipeline.syncOperations.addHandler(NIOSSLServerHandler(context: context))
                    }
                }
                .bind(host: host, port: 0).get()
            defer { server.close(promise: nil) }
            let port = try #require(server.localAddress?.port)
            let connector = try FabricConnector(
                identity: phone,
                alpn: FabricProtocol.dialALPN,
                address: try ControllerAddress(parsing: "https://\(host):\(port)")
            )
            let configured = NIOLockedValueBox(false)
            do {
                _ = try await connector.connect(on: group.next()) { _, _ in
                    configured.withLockedValue { $0 = true }
                }.get()
                Issue.record("connected")
            } catch {}
            #expect(!configured.withLockedValue { $0 }, "the connection was set up for the overlay")
        }
    }

    enum Impostor: String, CustomTestStringConvertible, Sendable {
        case otherAddress = "a controller certificate of the cluster's CA for another address"
        case otherCA = "a certificate for 127.0.0.1 from another CA"
        var testDescription: String { rawValue }
    }
}
