/// PEM text (RFC 7468) in the one layout every parser here accepts.
///
/// Identity files may come from another conforming client: its PEM can have CRLF line ends, no final newline,
/// indentation, or base64 lines of another width (RFC 7468 §3 lets a reader be lax about all of these; swift-asn1's
/// parser insists on 64-character lines). `canonical` rewrites each `BEGIN`/`END` block as LF-terminated lines of
/// 64 base64 characters, drops text outside the blocks (RFC 7468 §5.2 explanatory text), and keeps the blocks'
/// order. It checks no base64 and no DER: the parsers after it do. Text with no complete block is returned as it
/// came, for those parsers to refuse with their own words; so is text already in the canonical layout.
public enum PEMText {
    public static func canonical(_ text: String) -> String {
        var output = ""
        var label: Substring?
        var body = ""
        for rawLine in text.split(whereSeparator: { $0 == "\n" || $0 == "\r\n" || $0 == "\r" }) {
            let line = trimmed(rawLine)
            guard let open = label else {
                if line.hasPrefix("-----BEGIN "), line.hasSuffix("-----") {
                    label = line.dropFirst(11).dropLast(5)
                    body = ""
                }
                continue
            }
            guard line.hasPrefix("-----END ") else {
                body += line.filter { !$0.isWhitespace }
                continue
            }
            output += "-----BEGIN \(open)-----\n"
            var rest = body[...]
            while !rest.isEmpty {
                output += rest.prefix(64) + "\n"
                rest = rest.dropFirst(64)
            }
            output += "-----END \(open)-----\n"
            label = nil
        }
        // Text already in this layout comes back unchanged, whatever its final newline (swift-certificates writes
        // none, the private key writer one): a file this implementation wrote reads back byte for byte, so
        // comparing a certificate read from disk with one held in memory still means "the same certificate".
        guard !output.isEmpty, output != text, output.dropLast() != text else { return text }
        return output
    }

    private static func trimmed(_ line: Substring) -> Substring {
        let start = line.firstIndex { !$0.isWhitespace } ?? line.endIndex
        let end = line.lastIndex { !$0.isWhitespace }.map { line.index(after: $0) } ?? start
        return line[start..<max(start, end)]
    }
}
