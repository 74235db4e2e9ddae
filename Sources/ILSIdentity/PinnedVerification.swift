import Foundation
import ILSCore
import ILSCrypto
import NIOCore
import NIOSSL

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
        let chain = presented.compactMap { try? $0.toDERBytes() }
        guard chain.count == presented.count,
            let root = chain.first(where: { Fingerprint.sha256($0) == fingerprint })
        else {
            promise.succeed(.failed)
            return
        }
        Task {
            let valid = await ServerChainVerification.verify(chain: chain, root: root, host: host)
            promise.succeed(valid ? .certificateVerified : .failed)
        }
    }
}
