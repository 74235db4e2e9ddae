import Crypto
import Foundation
import ILSCore
import ILSCrypto
import ILSTesting
import Testing
import X509

/// Every certificate the CA issues carries AuthorityKeyIdentifier and SubjectKeyIdentifier (RFC 5280 §4.2.1.1,
/// §4.2.1.2), so strict verifiers build and accept the chain.
@Suite("Certificate extensions")
struct CertificateExtensionTests {
    @Test("OpenSSL's strict verifier accepts the CA, a server certificate and identity certificates of every role")
    func strictVerifierAcceptsEveryKind() throws {
        let authority = try CertificateAuthority.create(name: "strict CA")
        let server = try authority.issueServerCertificate(host: "127.0.0.1").certificatePEM
        var leaves = ["ca": authority.certificatePEM, "server": server]
        for role in [IdentityRole.device, .gateway, .admin] {
            leaves[role.rawValue] = try TestIdentities.issue(authority, name: "n-\(role.rawValue)", role: role)
                .certificatePEM
        }
        let directory = try Self.directory()
        defer { try? FileManager.default.removeItem(at: directory) }
        for (name, pem) in leaves {
            let result = try Self.verify(ca: authority.certificatePEM, leaf: pem, in: directory)
            #expect(result.status == 0, "\(name): \(result.output)")
        }
    }

    @Test("the key identifiers are SHA-1 of the subjectPublicKey (method 1), and each AKI names the CA's SKI")
    func identifiersLinkTheChain() throws {
        let authority = try CertificateAuthority.create(name: "strict CA")
        let caSKI = try #require(try authority.certificate.extensions.subjectKeyIdentifier).keyIdentifier
        #expect(
            Array(caSKI) == Array(Insecure.SHA1.hash(data: authority.certificate.publicKey.subjectPublicKeyInfoBytes))
        )
        #expect(try authority.certificate.extensions.authorityKeyIdentifier?.keyIdentifier == caSKI)
        let (pem, key) = try TestIdentities.issue(authority, name: "ipad", role: .device)
        let leaf = try Certificate(pemEncoded: pem)
        #expect(try leaf.extensions.authorityKeyIdentifier?.keyIdentifier == caSKI)
        #expect(
            try leaf.extensions.subjectKeyIdentifier?.keyIdentifier.map { $0 }
                == Array(Insecure.SHA1.hash(data: key.publicKey))
        )
        let server = try Certificate(
            pemEncoded: try authority.issueServerCertificate(host: "ctl.example").certificatePEM
        )
        #expect(try server.extensions.authorityKeyIdentifier?.keyIdentifier == caSKI)
        #expect(try server.extensions.subjectKeyIdentifier != nil)
    }

    @Test("the shape issued before (no AKI) is what the strict verifier refuses, and it still works end to end")
    func oldShapeIsRefused() throws {
        let authority = try CertificateAuthority.create(name: "strict CA")
        let caKey = try P256.Signing.PrivateKey(pemRepresentation: authority.privateKeyPEM)
        let deviceKey = IdentityKeyPair.generate()
        let old = try Certificate(
            version: .v3,
            serialNumber: .init(),
            publicKey: .init(try Curve25519.Signing.PublicKey(rawRepresentation: deviceKey.publicKey)),
            notValidBefore: Date().addingTimeInterval(-300),
            notValidAfter: Date().addingTimeInterval(86400),
            issuer: authority.certificate.subject,
            subject: try DistinguishedName {
                OrganizationalUnitName("device")
                CommonName("old")
            },
            signatureAlgorithm: .ecdsaWithSHA256,
            extensions: try Certificate.Extensions {
                Critical(BasicConstraints.notCertificateAuthority)
                Critical(KeyUsage(digitalSignature: true))
                try ExtendedKeyUsage([.clientAuth, .serverAuth])
                SubjectAlternativeNames([.uniformResourceIdentifier("urn:ils:identity:old")])
            },
            issuerPrivateKey: .init(caKey)
        )
        let directory = try Self.directory()
        defer { try? FileManager.default.removeItem(at: directory) }
        let result = try Self.verify(
            ca: authority.certificatePEM,
            leaf: try old.serializeAsPEM().pemString,
            in: directory
        )
        #expect(result.status != 0)
        #expect(result.output.contains("Authority Key Identifier"))

        // An identity enrolled before keeps working until it renews: its end-to-end handshake still completes.
        let device = try E2EHandshake.Credentials(
            certificatePEM: try old.serializeAsPEM().pemString,
            privateKeyPEM: deviceKey.privateKeyPEM,
            caCertificatePEM: authority.certificatePEM
        )
        let gateway = try TestIdentities.credentials(authority, name: "gw", role: .gateway)
        let initiator = E2EInitiator(credentials: device, service: "claude-api")
        let responder = E2EResponder(credentials: gateway)
        let (serverHello, _, _) = try responder.receiveClientHello(initiator.clientHello())
        let (finished, _) = try initiator.receiveServerHello(serverHello)
        #expect(try responder.receiveClientFinished(finished).peer.name == "old")
    }

    static func directory() throws -> URL {
        let url = FileManager.default.temporaryDirectory.appendingPathComponent("ils-aki-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: url, withIntermediateDirectories: true)
        return url
    }

    /// `openssl verify -x509_strict -CAfile ca.pem leaf.pem`: its exit status and what it printed.
    static func verify(ca: String, leaf: String, in directory: URL) throws -> (status: Int32, output: String) {
        let caFile = directory.appendingPathComponent("ca.pem")
        let leafFile = directory.appendingPathComponent("leaf.pem")
        try ca.write(to: caFile, atomically: true, encoding: .utf8)
        try leaf.write(to: leafFile, atomically: true, encoding: .utf8)
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        process.arguments = ["openssl", "verify", "-x509_strict", "-CAfile", caFile.path, leafFile.path]
        let pipe = Pipe()
        process.standardOutput = pipe
        process.standardError = pipe
        try process.run()
        let output = String(decoding: pipe.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        process.waitUntilExit()
        return (process.terminationStatus, output)
    }
}
