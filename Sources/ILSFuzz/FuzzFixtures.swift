import Foundation
import ILSController
import ILSCore
import ILSCrypto
import ILSStore
import Logging
import SwiftASN1

/// The fixed PKI and controller every fuzz target runs against, built once per process.
///
/// The keys are committed test fixtures (never used anywhere else): a seed corpus holds certificates, tokens and
/// records made with them, and those stay valid only if every run uses the same CA, token key and identity keys.
/// Identity certificates are issued afresh at start-up by the fixed CA; the end-to-end targets judge them at the
/// fixed instant `now`, so a seed made today still verifies in a year.
struct FuzzFixtures: Sendable {
    /// One identity known to the fixed controller.
    struct Identity: Sendable {
        let record: IdentityRecord
        let keyPair: IdentityKeyPair
        let certificate: IssuedCertificate
        let certificateDER: [UInt8]
        let credentials: E2EHandshake.Credentials
        /// Its one-time enrollment token, valid until 2100.
        let token: TokenRecord
    }

    static let shared: FuzzFixtures = {
        do {
            return try FuzzFixtures()
        } catch {
            fatalError("the fuzz fixtures could not be built: \(error)")
        }
    }()

    /// The instant the end-to-end targets verify certificates at (2026-11-24).
    static let now = Date(timeIntervalSince1970: 1_795_500_000)
    /// When the fixed tokens expire (2100-01-01).
    static let tokenExpiry: Int64 = 4_102_444_800
    static let address = "https://127.0.0.1:8443"
    static let service = "claude-api"
    static let logger = Logger(label: "ils.fuzz") { _ in SwiftLogNoOpLogHandler() }

    let authority: CertificateAuthority
    let tokenKey: IdentityKeyPair
    let address: ControllerAddress
    let server: (certificatePEM: String, privateKeyPEM: String)
    /// An admin and a gateway, both enrolled; a device with an unused token.
    let admin: Identity
    let gateway: Identity
    let device: Identity
    /// The device's certificate as the gateway reads it back.
    let deviceCertificate: IdentityCertificate

    private init() throws {
        authority = try CertificateAuthority(certificatePEM: Self.caCertificatePEM, privateKeyPEM: Self.caKeyPEM)
        tokenKey = try IdentityKeyPair(privateKeyPEM: Self.tokenKeyPEM)
        address = try ControllerAddress(parsing: Self.address)
        server = try authority.issueServerCertificate(host: "127.0.0.1")
        admin = try Self.identity("admin", .admin, Self.adminKeyPEM, authority)
        gateway = try Self.identity("gateway-1", .gateway, Self.gatewayKeyPEM, authority)
        device = try Self.identity("laptop", .device, Self.deviceKeyPEM, authority)
        deviceCertificate = try IdentityCertificate(der: device.certificateDER)
    }

    private static func identity(
        _ name: String,
        _ role: IdentityRole,
        _ keyPEM: String,
        _ authority: CertificateAuthority
    ) throws -> Identity {
        let keyPair = try IdentityKeyPair(privateKeyPEM: keyPEM)
        let record = IdentityRecord(
            id: "id-\(name)",
            name: name,
            role: role,
            attributes: [],
            state: .active,
            createdAt: 1_795_000_000
        )
        let certificate = try authority.issueIdentityCertificate(
            publicKey: keyPair.publicKey,
            identity: record,
            now: now
        )
        return Identity(
            record: record,
            keyPair: keyPair,
            certificate: certificate,
            certificateDER: try PEMDocument(pemString: certificate.pem).derBytes,
            credentials: try E2EHandshake.Credentials(
                certificatePEM: certificate.pem,
                privateKeyPEM: keyPEM,
                caCertificatePEM: caCertificatePEM
            ),
            token: TokenRecord(
                jti: "fuzz-\(name)",
                identityID: record.id,
                createdAt: 1_795_000_000,
                expiresAt: tokenExpiry
            )
        )
    }

    /// A fresh controller state in memory: the default service, the three identities, admin and gateway enrolled.
    /// Each fuzz iteration gets its own, so one input's changes (an enrollment, a deleted identity) never leak into
    /// the next and a finding replays the same way.
    func controllerState() throws(ILSError) -> ControllerState {
        // The store's calls are asynchronous and a fuzz iteration is not: wait for them on this thread (the store
        // runs them on its own threads).
        let made = CallerThread.wait { () async -> Result<ControllerState, ILSError> in
            do throws(ILSError) {
                return .success(try await self.makeControllerState())
            } catch {
                return .failure(error)
            }
        }
        return try made.get()
    }

    private func makeControllerState() async throws(ILSError) -> ControllerState {
        let store = try SQLiteControllerStore(path: SQLiteControllerStore.inMemory)
        try await store.createService(ControllerState.defaultService)
        for identity in [admin, gateway, device] {
            try await store.createIdentity(identity.record, token: identity.token, actor: "fuzz")
        }
        for identity in [admin, gateway] {
            _ = try await store.consumeToken(
                jti: identity.token.jti,
                identityID: identity.record.id,
                now: identity.token.createdAt,
                certificate: EnrolledCertificate(
                    fingerprint: identity.certificate.fingerprint,
                    notAfter: identity.certificate.notAfter,
                    publicKey: Base64URL.encode(identity.keyPair.publicKey)
                )
            )
        }
        let state = ControllerState(
            directory: "/nonexistent/ils-fuzz",
            address: address,
            authority: authority,
            serverCertificatePEM: server.certificatePEM + "\n" + authority.certificatePEM,
            serverKeyPEM: server.privateKeyPEM,
            tokenKey: tokenKey,
            store: store
        )
        try await state.identities.reload(from: store)
        return state
    }

    /// The device's enrollment token, signed by the fixed token key.
    func deviceToken() -> String {
        EnrollmentToken.sign(
            EnrollmentToken.Claims(
                iss: Self.address,
                sub: device.record.id,
                jti: device.token.jti,
                iat: device.token.createdAt,
                exp: Self.tokenExpiry,
                caFingerprint: authority.fingerprint,
                name: device.record.name,
                role: .device
            ),
            seed: tokenKey.seedForSigning
        )
    }

    static let caKeyPEM = """
        -----BEGIN PRIVATE KEY-----
        MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgOUZ1Ml/BtWBa/bL8
        obOak/SSkVnohcXdm1OzuXJCskahRANCAASe2ge/gTQ6p7kDm734CJ56wKCZaBsM
        1PsPgq8/gDWnqWnDmJUNwYw0uqC0yskLOvh94aHVzsXBY/j5SSx8dskB
        -----END PRIVATE KEY-----
        """

    static let caCertificatePEM = """
        -----BEGIN CERTIFICATE-----
        MIIBkzCCATmgAwIBAgIBATAKBggqhkjOPQQDAjAeMRwwGgYDVQQDDBNpbHMtZ2F0
        ZXdheSBmdXp6IENBMCAXDTI2MTEyMzA4NTUxMFoYDzIxMjYxMDMwMDg1NTEwWjAe
        MRwwGgYDVQQDDBNpbHMtZ2F0ZXdheSBmdXp6IENBMFkwEwYHKoZIzj0CAQYIKoZI
        zj0DAQcDQgAEntoHv4E0Oqe5A5u9+AieesCgmWgbDNT7D4KvP4A1p6lpw5iVDcGM
        NLqgtMrJCzr4feGh1c7FwWP4+UksfHbJAaNmMGQwHQYDVR0OBBYEFLSSlwixWG4O
        sMhOdhuUNxOJcUG0MB8GA1UdIwQYMBaAFLSSlwixWG4OsMhOdhuUNxOJcUG0MBIG
        A1UdEwEB/wQIMAYBAf8CAQAwDgYDVR0PAQH/BAQDAgEGMAoGCCqGSM49BAMCA0gA
        MEUCIQCEKE9778XPR30tSc6ZOd1++L4ebfPxLC/4Nto+itaF6gIgb/EIIVgPo1mt
        ijx9HUoFGViC1+evfLcopennHGCTTpU=
        -----END CERTIFICATE-----
        """

    static let tokenKeyPEM = """
        -----BEGIN PRIVATE KEY-----
        MC4CAQAwBQYDK2VwBCIEIFoc/ZXXEpx+gMPwUQcd7MHIRc0wuYJc8yuJs/+Jm9TO
        -----END PRIVATE KEY-----
        """

    static let adminKeyPEM = """
        -----BEGIN PRIVATE KEY-----
        MC4CAQAwBQYDK2VwBCIEIASPQIfWqBeUT1G83OhAk01KfyGaH9ZzQ9oI62PcZ66y
        -----END PRIVATE KEY-----
        """

    static let deviceKeyPEM = """
        -----BEGIN PRIVATE KEY-----
        MC4CAQAwBQYDK2VwBCIEIOcLYhcDkAibIZbqN3wSvvZ+K9aIluxiX00TwY/L6ip0
        -----END PRIVATE KEY-----
        """

    static let gatewayKeyPEM = """
        -----BEGIN PRIVATE KEY-----
        MC4CAQAwBQYDK2VwBCIEIBB7bbzDK6JprwCf4D4BbGt6YYvzYGBct0Kvbxzuxuhp
        -----END PRIVATE KEY-----
        """
}
