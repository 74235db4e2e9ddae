public import Foundation
public import ILSCore

/// Refuses to use an identity whose certificate has expired, with a sentence that says what to do, instead of a
/// TLS handshake failure nobody can read.
public enum IdentityValidity {
    public static func check(_ identity: IdentityFile, now: Date = Date()) throws(ILSError) {
        let certificate = try IdentityCertificate(pem: identity.certificate)
        guard now <= certificate.notAfter else {
            throw ILSError(
                .permissionDenied,
                "the certificate of identity '\(identity.identity.name)' expired on "
                    + "\(certificate.notAfter.formatted(.iso8601)); ask an admin to run "
                    + "'ils-gateway admin identity reissue \(identity.identity.name)' and enroll the new token"
            )
        }
    }
}
