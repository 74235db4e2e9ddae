import Foundation
import ILSCore

/// Ed25519 private keys as PKCS#8 (RFC 8410 §7): a fixed 16-byte DER prefix, then the 32-byte seed.
enum Ed25519PKCS8 {
    /// SEQUENCE { INTEGER 0, SEQUENCE { OID 1.3.101.112 }, OCTET STRING { OCTET STRING (32 bytes) } }
    static let prefix: [UInt8] = [
        0x30, 0x2E, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2B, 0x65, 0x70, 0x04, 0x22,
        0x04, 0x20,
    ]

    static func pem(seed: [UInt8]) -> String {
        let base64 = Data(prefix + seed).base64EncodedString()
        return "-----BEGIN PRIVATE KEY-----\n\(base64)\n-----END PRIVATE KEY-----\n"
    }

    static func seed(fromPEM pem: String) throws(ILSError) -> [UInt8] {
        let invalid = ILSError(.invalidInput, "the private key is not an Ed25519 PKCS#8 PEM key")
        let lines = pem.split(whereSeparator: \.isNewline).map { $0.trimmingCharacters(in: .whitespaces) }
        guard let begin = lines.firstIndex(of: "-----BEGIN PRIVATE KEY-----"),
            let end = lines.firstIndex(of: "-----END PRIVATE KEY-----"), begin < end,
            let der = Data(base64Encoded: lines[(begin + 1)..<end].joined()).map(Array.init),
            der.count == prefix.count + 32, Array(der[0..<prefix.count]) == prefix
        else { throw invalid }
        return Array(der[prefix.count...])
    }
}
