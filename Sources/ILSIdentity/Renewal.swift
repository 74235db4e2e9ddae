public import Foundation
public import ILSCore
import ILSCrypto

/// Certificate renewal without a token: a new key pair made here, a new certificate from the controller over mTLS
/// with the current one, and the identity file replaced atomically (mode 0600).
public enum Renewal {
    /// Renew when less than this is left (a third of the 90-day lifetime).
    public static let threshold: TimeInterval = 30 * 86400

    public static func isDue(_ file: IdentityFile, now: Date = Date()) -> Bool {
        isDue(notAfter: expiry(of: file), now: now)
    }

    /// Whether a certificate valid until `notAfter` (nil: unreadable, never due) should be renewed at `now`.
    public static func isDue(notAfter: Date?, now: Date = Date()) -> Bool {
        guard let notAfter else { return false }
        return notAfter.timeIntervalSince(now) < threshold
    }

    /// Renews the identity in `path` and returns the new file.
    public static func renew(path: String) async throws(ILSError) -> IdentityFile {
        let renewed = try await renewed(try IdentityFileIO.read(path))
        try IdentityFileIO.write(renewed, to: path, overwrite: true)
        return renewed
    }

    /// `file` with a new key pair (made here) and the controller's new certificate for it; stores nothing (an app
    /// keeps it in its own `IdentityStore`).
    public static func renewed(_ file: IdentityFile) async throws(ILSError) -> IdentityFile {
        let current = try IdentityCertificate(pem: file.certificate)
        let keyPair = IdentityKeyPair.generate()
        let proof = keyPair.sign(Array((ControllerAPI.RenewRequest.proofContext + current.fingerprint).utf8))
        let client = try ControllerClient(identityFile: file)
        let response = try await client.call(
            ControllerRoutes.renew,
            body: ControllerAPI.RenewRequest(
                publicKey: Base64URL.encode(keyPair.publicKey),
                proof: Base64URL.encode(proof)
            )
        )
        let certificate = try IdentityCertificate(pem: response.certificate)
        guard certificate.publicKey == keyPair.publicKey, certificate.id == current.id else {
            throw ILSError(.unavailable, "the controller returned a certificate for a different key or identity")
        }
        let renewed = IdentityFile(
            controller: response.controller,
            identity: response.identity,
            certificate: response.certificate,
            caCertificate: response.caCertificate,
            privateKey: keyPair.privateKeyPEM,
            // A controller of an earlier release sends no list: keep the one the file had.
            controllers: response.controllers.map {
                ControllerAddress.replicas([response.controller] + $0).map(\.description)
            } ?? file.controllers
        )
        return renewed
    }

    /// When `file`'s certificate stops being valid (nil if it cannot be read).
    public static func expiry(of file: IdentityFile) -> Date? {
        (try? IdentityCertificate(pem: file.certificate))?.notAfter
    }

    /// The error for a certificate that has expired: it cannot renew itself (renewal authenticates with it), so only
    /// a new enrollment helps.
    public static func expired(_ file: IdentityFile, on date: Date) -> ILSError {
        ILSError(
            .permissionDenied,
            "the certificate of '\(file.identity.name)' expired on \(ISO8601DateFormatter().string(from: date)): it was "
                + "not used while it could still renew itself; ask the admin for a new enrollment token and enroll again"
        )
    }

    /// Renews when due; returns the file to use either way.
    public static func renewIfDue(path: String, now: Date = Date()) async throws(ILSError) -> IdentityFile {
        let file = try IdentityFileIO.read(path)
        return isDue(file, now: now) ? try await renew(path: path) : file
    }
}
