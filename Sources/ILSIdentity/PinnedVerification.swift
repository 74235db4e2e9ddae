import Foundation
import ILSCore
import ILSCrypto
import NIOCore
import NIOSSL
import SwiftASN1
import X509

/// Verifies a controller's TLS chain against a CA known only by its fingerprint (from an enrollment token).
///
/// Trust assumption: the token reached the device intact, out of band. The CA whose DER hashes to the token's
/// fingerprint must be among the certificates the server presents, and the leaf must chain to it and name the host
/// we dialled (RFC 5280 path validation, RFC 6125 name check, by swift-certificates). Anything else fails the
/// handshake before the token is sent.
enum PinnedVerification {
    static func verify(
        _ presented: [NIOSSLCertificate],
        fingerprint: String,
        host: String,
        promise: EventLoopPromise<NIOSSLVerificationResult>
    ) {
        let parsed: [(der: [UInt8], certificate: Certificate)] = presented.compactMap { certificate in
            guard let der = try? certificate.toDERBytes(), let parsed = try? Certificate(derEncoded: der) else {
                return nil
            }
            return (der, parsed)
        }
        guard parsed.count == presented.count, let leaf = parsed.first?.certificate,
            let root = parsed.first(where: { Fingerprint.sha256($0.der) == fingerprint })?.certificate
        else {
            promise.succeed(.failed)
            return
        }
        let intermediates = parsed.dropFirst().map(\.certificate)
        let isIP = ControllerClient.isIPAddress(host)
        Task {
            var verifier = Verifier(rootCertificates: CertificateStore([root])) {
                RFC5280Policy()
                ServerIdentityPolicy(serverHostname: isIP ? nil : host, serverIP: isIP ? host : nil)
            }
            let result = await verifier.validate(leaf: leaf, intermediates: CertificateStore(intermediates))
            switch result {
            case .validCertificate: promise.succeed(.certificateVerified)
            case .couldNotValidate: promise.succeed(.failed)
            }
        }
    }
}
