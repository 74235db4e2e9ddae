import ILSCore
import NIOSSL

/// The TLS side of HTTP mode: TLS 1.2 or newer, ALPN `http/1.1`, the certificate chain and key from PEM files.
enum TLSServerContext {
    static func make(_ files: HTTPModeConfiguration.TLSFiles) throws(ILSError) -> NIOSSLContext {
        let chain: [NIOSSLCertificate]
        do {
            chain = try NIOSSLCertificate.fromPEMFile(files.certificateChain)
        } catch {
            throw ILSError(
                .invalidInput,
                "could not read the TLS certificate chain from \(files.certificateChain); it must be a PEM file",
                detail: "\(error)"
            )
        }
        guard !chain.isEmpty else {
            throw ILSError(.invalidInput, "\(files.certificateChain) holds no PEM certificate")
        }
        let key: NIOSSLPrivateKey
        do {
            key = try NIOSSLPrivateKey(file: files.privateKey, format: .pem)
        } catch {
            throw ILSError(
                .invalidInput,
                "could not read the TLS private key from \(files.privateKey); it must be an unencrypted PEM key",
                detail: "\(error)"
            )
        }
        var configuration = TLSConfiguration.makeServerConfiguration(
            certificateChain: chain.map { .certificate($0) },
            privateKey: .privateKey(key)
        )
        configuration.minimumTLSVersion = .tlsv12
        configuration.applicationProtocols = ["http/1.1"]
        do {
            return try NIOSSLContext(configuration: configuration)
        } catch {
            throw ILSError(
                .invalidInput,
                "the TLS certificate in \(files.certificateChain) does not match the key in \(files.privateKey)",
                detail: "\(error)"
            )
        }
    }
}
