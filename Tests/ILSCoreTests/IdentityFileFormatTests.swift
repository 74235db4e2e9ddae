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

    @Test(
        "a controller list heard from the cluster replaces the file's when the set differs; the same set, in any order, or none changes nothing"
    )
    func learningTheCluster() throws {
        let json = """
            {"version": 1, "controller": "https://a:8443", "certificate": "c", "caCertificate": "ca",
             "privateKey": "k", "identity": {"id": "b6f1", "name": "tablet", "role": "device", "state": "active", "createdAt": 1,
                          "attributes": []}}
            """
        let file = try JSONDecoder().decode(IdentityFile.self, from: Data(json.utf8))
        let a = try ControllerAddress(parsing: "https://a:8443")
        let b = try ControllerAddress(parsing: "https://b:8443")
        // A file written before replicas (no list): its own controller alone is nothing new.
        #expect(file.learning([a]) == nil)
        #expect(file.learning([]) == nil)
        let learned = try #require(file.learning([b, a]))
        #expect(learned.controller == "https://a:8443", "the file's own controller stays the first tried")
        #expect(learned.controllers == ["https://b:8443", "https://a:8443"])
        #expect(learned.controllerAddresses == [a, b])
        #expect(learned.learning([a, b]) == nil, "the same set in another order is not a change")
        // The file's own controller left the cluster: the list without it is kept, and not written again.
        let without = try #require(learned.learning([b]))
        #expect(without.controllerAddresses == [a, b])
        #expect(without.learning([b]) == nil)
    }

    @Test(
        "the ils-controllers header: comma-separated, spaces ignored, invalid entries and repeats dropped, at most 16"
    )
    func controllerListHeader() throws {
        let parsed = ControllerAddress.list(header: "https://a:8443, https://b:8443,nonsense,https://a:8443,  ")
        #expect(parsed.map(\.description) == ["https://a:8443", "https://b:8443"])
        #expect(ControllerAddress.header(["https://a:8443", "https://b:8443"]) == "https://a:8443, https://b:8443")
        let many = (1...40).map { "https://c\($0):8443" }.joined(separator: ",")
        #expect(ControllerAddress.list(header: many).count == ControllerAddress.maximumReplicas)
        #expect(ControllerAddress.list(header: "").isEmpty)
    }

    static func quoted(_ text: String) -> String {
        String(decoding: try! JSONEncoder().encode(text), as: UTF8.self)
    }
}
