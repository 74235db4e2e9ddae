public import ILSCore
public import ILSCrypto

/// Identities issued straight by a CA, without a controller: for tests of the end-to-end layer and of policies.
public enum TestIdentities {
    /// An identity certificate and key for `name`, issued by `authority`, with the id `id-<name>`.
    public static func issue(_ authority: CertificateAuthority, name: String, role: IdentityRole) throws
        -> (certificatePEM: String, keyPair: IdentityKeyPair)
    {
        let key = IdentityKeyPair.generate()
        let record = IdentityRecord(
            id: "id-\(name)",
            name: name,
            role: role,
            attributes: [],
            state: .active,
            createdAt: 0
        )
        return (try authority.issueIdentityCertificate(publicKey: key.publicKey, identity: record).pem, key)
    }

    /// End-to-end credentials issued by `authority`, trusting `trusting` (by default the same CA).
    public static func credentials(
        _ authority: CertificateAuthority,
        name: String,
        role: IdentityRole,
        trusting: CertificateAuthority? = nil
    ) throws -> E2EHandshake.Credentials {
        let (pem, key) = try issue(authority, name: name, role: role)
        return try E2EHandshake.Credentials(
            certificatePEM: pem,
            privateKeyPEM: key.privateKeyPEM,
            caCertificatePEM: (trusting ?? authority).certificatePEM
        )
    }
}
