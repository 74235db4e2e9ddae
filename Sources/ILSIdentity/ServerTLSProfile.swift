public import ILSCore
public import NIOSSL

/// The one TLS profile of every server a browser or an older client reaches over TLS (HTTP mode and the console): TLS
/// 1.2 or newer with forward-secret AEAD suites only, ALPN `http/1.1`, the certificate chain and key from PEM files,
/// and, with a controller CA, client certificates verified against it. One code path, so the two cannot drift apart
/// (the console once offered five TLS 1.2 suites, CBC ones among them, in the client's order).
public enum ServerTLSProfile {
    /// The TLS 1.2 suites offered: ECDHE key exchange and AES-128-GCM, one suite per certificate key type, so that
    /// whichever order a client lists its suites in, the server's choice is the same (a server cipher order).
    ///
    /// Why not server preference over Mozilla's whole "intermediate" list (AES-128/256-GCM, ChaCha20-Poly1305):
    /// swift-nio-ssl has no public way to set BoringSSL's `SSL_OP_CIPHER_SERVER_PREFERENCE` (it never calls
    /// `SSL_CTX_set_options`, and the cipher string has no syntax for it), so with three suites the client would
    /// pick. Offering one leaves nothing to pick; every TLS 1.2 client with ECDHE and GCM has this suite (it is the
    /// one RFC 9325 §4.2 recommends first), and clients that want ChaCha20 have TLS 1.3. No CBC suite (LUCKY13), no
    /// static-RSA key exchange (no forward secrecy). TLS 1.3's suites are all AEAD and BoringSSL does not let them
    /// be configured.
    public static let tls12CipherSuites = "ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-AES128-GCM-SHA256"

    /// Signature algorithms accepted in a client's CertificateVerify: identity certificates hold Ed25519 keys
    /// (RFC 8446 §4.2.3), the rest are the usual ones.
    public static let clientSignatureAlgorithms: [SignatureAlgorithm] = [
        .ed25519, .ecdsaSecp256R1Sha256, .ecdsaSecp384R1Sha384, .rsaPssRsaeSha256, .rsaPssRsaeSha384,
        .rsaPkcs1Sha256,
    ]

    /// A server context with this profile (HTTP mode).
    public static func context(
        certificateChain: String,
        privateKey: String,
        clientCA: String? = nil
    ) throws(ILSError) -> NIOSSLContext {
        let configuration = try configuration(
            certificateChain: certificateChain,
            privateKey: privateKey,
            clientCA: clientCA
        )
        do {
            return try NIOSSLContext(configuration: configuration)
        } catch {
            throw ILSError(
                .invalidInput,
                "the TLS certificate in \(certificateChain) does not match the key in \(privateKey)",
                detail: "\(error)"
            )
        }
    }

    /// The profile's configuration, checked (the key matches the certificate) but not yet a context: Hummingbird's
    /// `TLSChannel` (the console) makes its own.
    public static func configuration(
        certificateChain certificateChainPath: String,
        privateKey privateKeyPath: String,
        clientCA: String? = nil
    ) throws(ILSError) -> TLSConfiguration {
        let chain: [NIOSSLCertificate]
        do {
            chain = try NIOSSLCertificate.fromPEMFile(certificateChainPath)
        } catch {
            throw ILSError(
                .invalidInput,
                "could not read the TLS certificate chain from \(certificateChainPath); it must be a PEM file",
                detail: "\(error)"
            )
        }
        guard !chain.isEmpty else {
            throw ILSError(.invalidInput, "\(certificateChainPath) holds no PEM certificate")
        }
        let key: NIOSSLPrivateKey
        do {
            key = try NIOSSLPrivateKey(file: privateKeyPath, format: .pem)
        } catch {
            throw ILSError(
                .invalidInput,
                "could not read the TLS private key from \(privateKeyPath); it must be an unencrypted PEM key",
                detail: "\(error)"
            )
        }
        var configuration = TLSConfiguration.makeServerConfiguration(
            certificateChain: chain.map { .certificate($0) },
            privateKey: .privateKey(key)
        )
        configuration.minimumTLSVersion = .tlsv12
        configuration.cipherSuites = tls12CipherSuites
        configuration.applicationProtocols = ["http/1.1"]
        if let clientCA {
            do {
                configuration.trustRoots = .certificates(
                    try NIOSSLCertificate.fromPEMBytes(Array(clientCA.utf8))
                )
            } catch {
                throw ILSError(.invalidInput, "the controller CA certificate could not be read", detail: "\(error)")
            }
            // A client without a certificate, or with one another CA issued, fails the handshake itself. Hostnames
            // are not checked: a client certificate names an identity, not a host.
            configuration.certificateVerification = .noHostnameVerification
            configuration.verifySignatureAlgorithms = clientSignatureAlgorithms
        }
        do {
            _ = try NIOSSLContext(configuration: configuration)
        } catch {
            throw ILSError(
                .invalidInput,
                "the TLS certificate in \(certificateChainPath) does not match the key in \(privateKeyPath)",
                detail: "\(error)"
            )
        }
        return configuration
    }
}
