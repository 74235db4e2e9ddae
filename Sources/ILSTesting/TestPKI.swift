import Crypto
public import Foundation
import SwiftASN1
import X509

/// A throwaway certificate authority and a server certificate for 127.0.0.1 and localhost, written as PEM files
/// into a fresh temporary directory, for tests that need real TLS.
public struct TestPKI: Sendable {
    public let directory: URL
    public let caCertificatePEM: String
    public let serverCertificatePath: String
    public let serverKeyPath: String
    public let caCertificatePath: String

    public init() throws {
        let directory = FileManager.default.temporaryDirectory
            .appendingPathComponent("ils-pki-\(UUID().uuidString)", isDirectory: true)
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        self.directory = directory

        let now = Date()
        let caKey = P256.Signing.PrivateKey()
        let caName = try DistinguishedName { CommonName("ils-gateway test CA") }
        let ca = try Certificate(
            version: .v3,
            serialNumber: .init(),
            publicKey: .init(caKey.publicKey),
            notValidBefore: now.addingTimeInterval(-3600),
            notValidAfter: now.addingTimeInterval(86400),
            issuer: caName,
            subject: caName,
            signatureAlgorithm: .ecdsaWithSHA256,
            extensions: try Certificate.Extensions {
                Critical(BasicConstraints.isCertificateAuthority(maxPathLength: nil))
                Critical(KeyUsage(keyCertSign: true))
            },
            issuerPrivateKey: .init(caKey)
        )
        let serverKey = P256.Signing.PrivateKey()
        let server = try Certificate(
            version: .v3,
            serialNumber: .init(),
            publicKey: .init(serverKey.publicKey),
            notValidBefore: now.addingTimeInterval(-3600),
            notValidAfter: now.addingTimeInterval(86400),
            issuer: caName,
            subject: try DistinguishedName { CommonName("localhost") },
            signatureAlgorithm: .ecdsaWithSHA256,
            extensions: try Certificate.Extensions {
                Critical(BasicConstraints.notCertificateAuthority)
                Critical(KeyUsage(digitalSignature: true))
                try ExtendedKeyUsage([.serverAuth])
                SubjectAlternativeNames([
                    .ipAddress(ASN1OctetString(contentBytes: [127, 0, 0, 1])),
                    .dnsName("localhost"),
                ])
            },
            issuerPrivateKey: .init(caKey)
        )
        caCertificatePEM = try ca.serializeAsPEM().pemString
        caCertificatePath = directory.appendingPathComponent("ca.pem").path
        serverCertificatePath = directory.appendingPathComponent("server.pem").path
        serverKeyPath = directory.appendingPathComponent("server.key").path
        try caCertificatePEM.write(toFile: caCertificatePath, atomically: true, encoding: .utf8)
        try server.serializeAsPEM().pemString.write(toFile: serverCertificatePath, atomically: true, encoding: .utf8)
        try serverKey.pemRepresentation.write(toFile: serverKeyPath, atomically: true, encoding: .utf8)
    }

    public func remove() {
        try? FileManager.default.removeItem(at: directory)
    }
}
