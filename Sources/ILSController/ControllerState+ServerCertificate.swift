public import Foundation
public import ILSCore
import ILSCrypto

extension ControllerState {
    /// Replaces the controller's TLS certificate and key with fresh ones signed by the same CA, for `address` (a new
    /// name the controller moves to) or for the address it has. Identities stay valid: devices and gateways trust the
    /// CA, never the server certificate itself. A running controller picks the new certificate up when restarted. The store is not opened.
    ///
    /// The old certificate stays in the directory as `server.pem.old`/`server.key.old` until the next rotation, so a
    /// mistake can be undone by hand.
    public static func rotateServerCertificate(
        directory: String,
        address: ControllerAddress?,
        now: Date = Date()
    ) throws(ILSError) -> Files {
        let current = try Files(directory: directory)
        let target = address ?? current.address
        let server: (certificatePEM: String, privateKeyPEM: String)
        do {
            server = try current.authority.issueServerCertificate(host: target.host, now: now)
        } catch {
            throw ILSError(.internalError, "could not issue a TLS certificate for \(target.host)")
        }
        let chain = server.certificatePEM + "\n" + current.authority.certificatePEM
        try SecureFile.write(
            Data(current.serverCertificatePEM.utf8),
            to: "\(directory)/server.pem.old",
            overwrite: true
        )
        try SecureFile.write(Data(current.serverKeyPEM.utf8), to: "\(directory)/server.key.old", overwrite: true)
        try SecureFile.write(Data(server.privateKeyPEM.utf8), to: "\(directory)/server.key", overwrite: true)
        try SecureFile.write(Data(chain.utf8), to: "\(directory)/server.pem", overwrite: true)
        if target != current.address {
            let configuration = Configuration(
                version: 1,
                address: target.description,
                caFingerprint: current.authority.fingerprint
            )
            try SecureFile.write(try encode(configuration), to: "\(directory)/controller.json", overwrite: true)
        }
        return try Files(directory: directory)
    }
}
