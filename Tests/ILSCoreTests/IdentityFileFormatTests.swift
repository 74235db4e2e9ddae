import Foundation
import ILSCore
import Testing

/// An identity file written by another conforming client (docs/identities.md, "The identity file") reads as the
/// same identity.
@Suite("Identity files from other clients")
struct IdentityFileFormatTests {
    /// 150 base64 characters: three lines in this implementation's layout (64, 64, 22).
    static let body = String(repeating: "QUJDREVGR0hJSktMTU5PUFFSU1RVVldYWVo", count: 5).prefix(150)

    static func pem(_ label: String, width: Int, newline: String, indent: String = "", finalNewline: Bool) -> String {
        var lines = ["-----BEGIN \(label)-----"]
        var rest = body[...]
        while !rest.isEmpty {
            lines.append(indent + rest.prefix(width))
            rest = rest.dropFirst(width)
        }
        lines.append("-----END \(label)-----")
        return lines.joined(separator: newline) + (finalNewline ? newline : "")
    }

    static let canonical = pem("CERTIFICATE", width: 64, newline: "\n", finalNewline: false)

    @Test("PEM with CRLF, other widths, indentation and no final newline reads as this implementation's layout")
    func foreignPEM() {
        for foreign in [
            Self.pem("CERTIFICATE", width: 64, newline: "\r\n", finalNewline: false),
            Self.pem("CERTIFICATE", width: 76, newline: "\r\n", indent: "  ", finalNewline: false),
            Self.pem("CERTIFICATE", width: 40, newline: "\n", indent: "\t", finalNewline: true),
            "explanatory text\n" + Self.pem("CERTIFICATE", width: 150, newline: "\n", finalNewline: true),
        ] {
            #expect(PEMText.canonical(foreign) == Self.canonical + "\n", "\(foreign.debugDescription)")
        }
    }

    @Test("this implementation's own PEM reads back byte for byte, with or without its final newline")
    func ownPEMUnchanged() {
        #expect(PEMText.canonical(Self.canonical) == Self.canonical)
        #expect(PEMText.canonical(Self.canonical + "\n") == Self.canonical + "\n")
        #expect(PEMText.canonical("not PEM at all") == "not PEM at all")
    }

    @Test("keys in another order, unknown keys and JSON whitespace are accepted")
    func foreignJSON() throws {
        let certificate = Self.pem("CERTIFICATE", width: 76, newline: "\r\n", finalNewline: false)
        let key = Self.pem("PRIVATE KEY", width: 64, newline: "\r\n", finalNewline: false)
        let json = """

            {\t"writtenBy": "another client", "privateKey": \(Self.quoted(key)),
              "caCertificate": \(Self.quoted(certificate)), "certificate": \(Self.quoted(certificate)),
              "identity": {"lastSeenAt": 5, "state": "active", "createdAt": 1, "attributes": [], "role": "device",
                           "name": "tablet", "id": "b6f1", "model": "iPad14,1"},
              "controller": "https://127.0.0.1:7443", "version": 1, "extra": {"nested": [1, 2]}}

            """
        let file = try JSONDecoder().decode(IdentityFile.self, from: Data(json.utf8))
        #expect(file.identity.name == "tablet" && file.identity.id == "b6f1" && file.identity.role == .device)
        #expect(file.controller == "https://127.0.0.1:7443")
        #expect(file.certificate == Self.canonical + "\n")
        #expect(file.caCertificate == Self.canonical + "\n")
        #expect(file.privateKey.hasPrefix("-----BEGIN PRIVATE KEY-----\n") && !file.privateKey.contains("\r"))
    }

    static func quoted(_ text: String) -> String {
        String(decoding: try! JSONEncoder().encode(text), as: UTF8.self)
    }
}
