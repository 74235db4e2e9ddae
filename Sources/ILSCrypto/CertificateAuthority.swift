public import Crypto
public import Foundation
public import ILSCore
import SwiftASN1
public import X509

/// The controller's certificate authority: a P-256 key that signs the controller's TLS certificate and every
/// identity certificate.
///
/// Identity certificates bind an identity's Ed25519 public key (made on the identity's own machine) to its id
/// (`urn:ils:identity:<id>` in subjectAltName), its name (CN) and its role (OU). The CA key is P-256 because every
/// TLS stack accepts ECDSA certificate chains.
public struct CertificateAuthority: Sendable {
    public let certificate: Certificate
    private let privateKey: P256.Signing.PrivateKey

    /// How long identity certificates are valid.
    public static let identityCertificateLifetime: TimeInterval = 90 * 86400

    public init(certificate: Certificate, privateKey: P256.Signing.PrivateKey) {
        self.certificate = certificate
        self.privateKey = privateKey
    }

    /// Loads the CA from its PEM files' contents.
    public init(certificatePEM: String, privateKeyPEM: String) throws {
        self.certificate = try Certificate(pemEncoded: certificatePEM)
        self.privateKey = try P256.Signing.PrivateKey(pemRepresentation: privateKeyPEM)
    }

    /// A new self-signed CA, valid for ten years.
    public static func create(name: String, now: Date = Date()) throws -> CertificateAuthority {
        let key = P256.Signing.PrivateKey()
        let subject = try DistinguishedName { CommonName(name) }
        let certificate = try Certificate(
            version: .v3,
            serialNumber: .init(),
            publicKey: .init(key.publicKey),
            notValidBefore: now.addingTimeInterval(-300),
            notValidAfter: now.addingTimeInterval(10 * 365 * 86400),
            issuer: subject,
            subject: subject,
            signatureAlgorithm: .ecdsaWithSHA256,
            extensions: try Certificate.Extensions {
                Critical(BasicConstraints.isCertificateAuthority(maxPathLength: 0))
                Critical(KeyUsage(keyCertSign: true, cRLSign: true))
                SubjectKeyIdentifier(hash: .init(key.publicKey))
                // Self-signed: RFC 5280 §4.2.1.1 lets it omit the AKI, but strict verifiers look for it on every
                // certificate of a chain; it names the CA's own key.
                AuthorityKeyIdentifier(keyIdentifier: SubjectKeyIdentifier(hash: .init(key.publicKey)).keyIdentifier)
            },
            issuerPrivateKey: .init(key)
        )
        return CertificateAuthority(certificate: certificate, privateKey: key)
    }

    public var certificatePEM: String { (try? certificate.serializeAsPEM().pemString) ?? "" }
    public var privateKeyPEM: String { privateKey.pemRepresentation }

    /// SHA-256 of the CA certificate's DER: the pin carried by every enrollment token.
    public var fingerprint: String { Fingerprint.sha256(Self.der(certificate)) }

    /// A TLS server certificate for the controller's host name or IP address, with a fresh P-256 key.
    public func issueServerCertificate(host: String, now: Date = Date()) throws -> (
        certificatePEM: String,
        privateKeyPEM: String
    ) {
        let key = P256.Signing.PrivateKey()
        var names: [GeneralName] = []
        if let ip = Self.ipAddressBytes(host) {
            names.append(.ipAddress(ASN1OctetString(contentBytes: ArraySlice(ip))))
        } else {
            names.append(.dnsName(host))
        }
        if host != "localhost" { names.append(.dnsName("localhost")) }
        if host != "127.0.0.1" { names.append(.ipAddress(ASN1OctetString(contentBytes: [127, 0, 0, 1]))) }
        let certificate = try Certificate(
            version: .v3,
            serialNumber: .init(),
            publicKey: .init(key.publicKey),
            notValidBefore: now.addingTimeInterval(-300),
            notValidAfter: now.addingTimeInterval(2 * 365 * 86400),
            issuer: self.certificate.subject,
            subject: try DistinguishedName { CommonName(host) },
            signatureAlgorithm: .ecdsaWithSHA256,
            extensions: try Certificate.Extensions {
                Critical(BasicConstraints.notCertificateAuthority)
                Critical(KeyUsage(digitalSignature: true))
                try ExtendedKeyUsage([.serverAuth])
                SubjectAlternativeNames(names)
                SubjectKeyIdentifier(hash: .init(key.publicKey))
                AuthorityKeyIdentifier(keyIdentifier: authorityKeyIdentifier)
            },
            issuerPrivateKey: .init(privateKey)
        )
        return (try certificate.serializeAsPEM().pemString, key.pemRepresentation)
    }

    /// Signs an identity certificate for `publicKey` (Ed25519, 32 bytes).
    public func issueIdentityCertificate(
        publicKey: [UInt8],
        identity: IdentityRecord,
        now: Date = Date()
    ) throws -> IssuedCertificate {
        let key = try Curve25519.Signing.PublicKey(rawRepresentation: publicKey)
        let notAfter = now.addingTimeInterval(Self.identityCertificateLifetime)
        let certificate = try Certificate(
            version: .v3,
            serialNumber: .init(),
            publicKey: .init(key),
            notValidBefore: now.addingTimeInterval(-300),
            notValidAfter: notAfter,
            issuer: self.certificate.subject,
            subject: try DistinguishedName {
                OrganizationalUnitName(identity.role.rawValue)
                CommonName(identity.name)
            },
            signatureAlgorithm: .ecdsaWithSHA256,
            extensions: try Certificate.Extensions {
                Critical(BasicConstraints.notCertificateAuthority)
                Critical(KeyUsage(digitalSignature: true))
                try ExtendedKeyUsage([.clientAuth, .serverAuth])
                SubjectAlternativeNames([.uniformResourceIdentifier(IdentityCertificate.uriPrefix + identity.id)])
                SubjectKeyIdentifier(hash: .init(key))
                AuthorityKeyIdentifier(keyIdentifier: authorityKeyIdentifier)
            },
            issuerPrivateKey: .init(privateKey)
        )
        return IssuedCertificate(
            pem: try certificate.serializeAsPEM().pemString,
            fingerprint: Fingerprint.sha256(Self.der(certificate)),
            notAfter: Int64(notAfter.timeIntervalSince1970)
        )
    }

    /// The key identifier that every certificate this CA issues names in its AuthorityKeyIdentifier (RFC 5280
    /// §4.2.1.1): the CA certificate's own SubjectKeyIdentifier, which this CA computes by RFC 5280 §4.2.1.2's
    /// method 1 (SHA-1 of the subjectPublicKey BIT STRING's value). A CA certificate without one (none made here)
    /// gets the same hash computed.
    var authorityKeyIdentifier: ArraySlice<UInt8> {
        if let own = try? certificate.extensions.subjectKeyIdentifier { return own.keyIdentifier }
        return SubjectKeyIdentifier(hash: certificate.publicKey).keyIdentifier
    }

    static func der(_ certificate: Certificate) -> [UInt8] {
        var serializer = DER.Serializer()
        try? serializer.serialize(certificate)
        return serializer.serializedBytes
    }

    static func ipAddressBytes(_ host: String) -> [UInt8]? {
        let parts = host.split(separator: ".")
        guard parts.count == 4 else { return nil }
        let bytes = parts.compactMap { UInt8($0) }
        return bytes.count == 4 ? bytes : nil
    }
}

/// A certificate just issued by the CA.
public struct IssuedCertificate: Sendable {
    public let pem: String
    public let fingerprint: String
    public let notAfter: Int64
}

/// The identity fields a certificate carries, read back.
public struct IdentityCertificate: Sendable {
    static let uriPrefix = "urn:ils:identity:"

    public let id: String
    public let name: String
    public let role: IdentityRole
    public let fingerprint: String
    public let notAfter: Date
    public let publicKey: [UInt8]

    public init(der: [UInt8]) throws(ILSError) {
        let invalid = ILSError(.invalidInput, "the certificate is not an ils-gateway identity certificate")
        guard let certificate = try? Certificate(derEncoded: der) else { throw invalid }
        guard let names = try? certificate.extensions.subjectAlternativeNames,
            let id = names.lazy.compactMap({ name -> String? in
                if case .uniformResourceIdentifier(let uri) = name, uri.hasPrefix(Self.uriPrefix) {
                    return String(uri.dropFirst(Self.uriPrefix.count))
                }
                return nil
            }).first
        else { throw invalid }
        var commonName: String?
        var unit: String?
        for rdn in certificate.subject {
            for attribute in rdn {
                if attribute.type == .RDNAttributeType.commonName { commonName = String(describing: attribute.value) }
                if attribute.type == .RDNAttributeType.organizationalUnitName {
                    unit = String(describing: attribute.value)
                }
            }
        }
        guard let commonName, let unit, let role = IdentityRole(rawValue: unit),
            let key = Curve25519.Signing.PublicKey(certificate.publicKey)
        else { throw invalid }
        self.id = id
        self.name = commonName
        self.role = role
        self.fingerprint = Fingerprint.sha256(der)
        self.notAfter = certificate.notValidAfter
        self.publicKey = Array(key.rawRepresentation)
    }

    public init(pem: String) throws(ILSError) {
        guard let certificate = try? Certificate(pemEncoded: pem) else {
            throw ILSError(.invalidInput, "the certificate is not valid PEM")
        }
        try self.init(der: CertificateAuthority.der(certificate))
    }
}
