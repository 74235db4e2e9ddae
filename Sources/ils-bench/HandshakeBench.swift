import Foundation
import ILSCore
import ILSCrypto
import ILSSodium

/// The end-to-end handshake and records in one process, per version: full handshakes per second (both ends, one
/// thread, certificates verified and then cached as in a real gateway) and records sealed and opened per second, so
/// version 3 (SHA-256, HKDF-SHA256) can be compared with version 2 (BLAKE2b, crypto_kx) on the same machine.
enum HandshakeBench {
    struct Result: Encodable {
        let version: Int
        let suite: String
        let handshakesPerSecond: Double
        let recordsGBPerSecond: Double
    }

    static func run(seconds: Double) throws -> [Result] {
        let authority = try CertificateAuthority.create(name: "bench CA")
        let device = try credentials(authority, name: "device", role: .device)
        let gateway = try credentials(authority, name: "gateway", role: .gateway)
        return try E2EHandshakeVersions.all.filter { $0.number >= 2 }.map { version in
            let clock = ContinuousClock()
            var handshakes = 0
            var session: (E2ESession, E2ESession)?
            let start = clock.now
            while (clock.now - start) < .seconds(seconds) {
                let initiator = E2EInitiator(credentials: device, service: "claude-api", version: version)
                let responder = E2EResponder(credentials: gateway, versions: E2EHandshakeVersions.all)
                let serverHello = try responder.receiveClientHello(initiator.clientHello()).serverHello
                let (finished, deviceSession) = try initiator.receiveServerHello(serverHello)
                session = (deviceSession, try responder.receiveClientFinished(finished))
                handshakes += 1
            }
            let elapsed = clock.now - start
            let (deviceSession, gatewaySession) = session!
            let record = [UInt8](repeating: 0x61, count: 65536)
            var sealed = [UInt8](repeating: 0, count: record.count + E2ERecord.overhead)
            var opened = [UInt8](repeating: 0, count: record.count)
            var bytes = 0
            let recordsStart = clock.now
            while (clock.now - recordsStart) < .seconds(seconds) {
                record.withUnsafeBytes { input in
                    sealed.withUnsafeMutableBytes { deviceSession.sender.seal(input, into: $0, final: false) }
                }
                _ = try sealed.withUnsafeBytes { input in
                    try opened.withUnsafeMutableBytes { try gatewaySession.receiver.open(input, into: $0) }
                }
                bytes += record.count
            }
            let recordsElapsed = clock.now - recordsStart
            return Result(
                version: Int(version.number),
                suite: deviceSession.suite.description,
                handshakesPerSecond: Double(handshakes) / elapsed.seconds,
                recordsGBPerSecond: Double(bytes) / recordsElapsed.seconds / 1e9
            )
        }
    }

    private static func credentials(_ authority: CertificateAuthority, name: String, role: IdentityRole) throws
        -> E2EHandshake.Credentials
    {
        let key = IdentityKeyPair.generate()
        let record = IdentityRecord(id: name, name: name, role: role, attributes: [], state: .active, createdAt: 0)
        let certificate = try authority.issueIdentityCertificate(publicKey: key.publicKey, identity: record)
        return try E2EHandshake.Credentials(
            certificatePEM: certificate.pem,
            privateKeyPEM: key.privateKeyPEM,
            caCertificatePEM: authority.certificatePEM
        )
    }
}

extension Duration {
    /// In seconds, for rates.
    var seconds: Double {
        let (whole, attoseconds) = components
        return Double(whole) + Double(attoseconds) / 1e18
    }
}
