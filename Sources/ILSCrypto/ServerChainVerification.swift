import SwiftASN1
import X509

/// Whether a TLS server's certificate chain is one a controller may present: it chains to `root` (RFC 5280 path
/// validation) and its leaf names the host that was dialled (RFC 6125: a DNS name, or an IP address in an IP SAN).
/// swift-certificates does both. Used where the CA is known only by its fingerprint (`PinnedVerification`, enrollment);
/// the overlay's connections, whose CA is in the identity file, leave the same two checks to NIOSSL.
public enum ServerChainVerification {
    /// - Parameters:
    ///   - chain: the DER certificates the server presented, leaf first.
    ///   - root: the DER of the only CA trusted.
    ///   - host: the host of the address dialled.
    public static func verify(chain: [[UInt8]], root: [UInt8], host: String) async -> Bool {
        guard let leafDER = chain.first,
            let leaf = try? Certificate(derEncoded: leafDER),
            let rootCertificate = try? Certificate(derEncoded: root)
        else { return false }
        var intermediates: [Certificate] = []
        for der in chain.dropFirst() {
            guard let certificate = try? Certificate(derEncoded: der) else { return false }
            intermediates.append(certificate)
        }
        let isIP = isIPAddress(host)
        var verifier = Verifier(rootCertificates: CertificateStore([rootCertificate])) {
            RFC5280Policy()
            ServerIdentityPolicy(serverHostname: isIP ? nil : host, serverIP: isIP ? host : nil)
        }
        switch await verifier.validate(leaf: leaf, intermediates: CertificateStore(intermediates)) {
        case .validCertificate: return true
        case .couldNotValidate: return false
        }
    }

    /// An IPv6 literal (it has a colon) or a dotted IPv4 one; anything else is a DNS name.
    public static func isIPAddress(_ host: String) -> Bool {
        host.contains(":") || host.split(separator: ".").count == 4 && host.allSatisfy { $0.isNumber || $0 == "." }
    }
}
