/// An enrollment token as a QR code carries it: `ils-enroll://v1/<JWT>`. A URI with its own scheme, so a camera app
/// hands it to ours and our scanner can tell it from any other code. The JWT is base64url and `.` only: nothing in it
/// needs percent-encoding. Pure and in ILSCore, so the app's scanner and `ils-gateway enroll` read it alike.
public enum EnrollmentURI {
    public static let scheme = "ils-enroll"
    /// The format version, as the URI's host; a later format takes another.
    public static let version = "v1"
    /// The longest URI read: the prefix and a token at its longest (`EnrollmentToken.maximumLength`, 4096).
    public static let maximumLength = 4096 + 32

    /// The URI that carries `token`.
    public static func uri(for token: String) -> String {
        "\(scheme)://\(version)/\(token)"
    }

    /// The token `text` carries, if `text` is an enrollment URI (the scheme in any case); nil if it is not one at all.
    /// A URI of ours that is malformed (another version, a query, a fragment, not three dot-separated base64url parts,
    /// too long) is refused as `token_malformed`, never guessed at.
    public static func token(from text: String) throws(ILSError) -> String? {
        let prefix = "\(scheme)://"
        guard text.utf8.count >= prefix.utf8.count,
            String(decoding: text.utf8.prefix(prefix.utf8.count), as: UTF8.self).lowercased() == prefix
        else { return nil }
        guard text.utf8.count <= maximumLength else { throw EnrollmentRefusal.malformedToken.error }
        let rest = text.utf8.dropFirst(prefix.utf8.count)
        let parts = rest.split(separator: UInt8(ascii: "/"), maxSplits: 1, omittingEmptySubsequences: false)
        guard parts.count == 2, String(decoding: parts[0], as: UTF8.self) == version else {
            throw EnrollmentRefusal.malformedToken.error
        }
        let token = parts[1]
        let base64url = token.allSatisfy { byte in
            (byte >= 97 && byte <= 122) || (byte >= 65 && byte <= 90) || (byte >= 48 && byte <= 57)
                || byte == UInt8(ascii: "-") || byte == UInt8(ascii: "_") || byte == UInt8(ascii: ".")
        }
        let segments = token.split(separator: UInt8(ascii: "."), omittingEmptySubsequences: false)
        guard base64url, segments.count == 3, segments.allSatisfy({ !$0.isEmpty }) else {
            throw EnrollmentRefusal.malformedToken.error
        }
        return String(decoding: token, as: UTF8.self)
    }
}
