/// Characters that steer a terminal instead of showing up on it, and how to make them visible.
///
/// A string that reached us from the network (a service name a gateway sent, a refusal sentence a controller
/// answered, an audit row) can hold ESC sequences (ECMA-48 CSI: move the cursor, clear the line, change colours),
/// a carriage return that overwrites the line it is on, a BEL, or Unicode bidirectional overrides that reorder
/// what is shown. Printed raw, it forges lines on an admin's terminal. Every text the CLI prints goes through
/// `escapingControlCharacters`; JSON output does not need it (the JSON encoder escapes C0 and DEL itself, and a
/// JSON consumer gets the exact string back).
public enum ControlCharacters {
    /// Whether `scalar` can move the cursor, change the display or reorder the text around it when printed:
    /// C0 (U+0000–U+001F, tab and newline included: a name never holds one), DEL, C1 (U+0080–U+009F, which some
    /// terminals take as 8-bit CSI/OSC), the line and paragraph separators, and the bidirectional controls
    /// (Unicode TR9: LRM/RLM, the embeddings and overrides U+202A–U+202E, the isolates U+2066–U+2069).
    public static func isControl(_ scalar: Unicode.Scalar) -> Bool {
        switch scalar.value {
        case 0x00...0x1F, 0x7F...0x9F: return true
        case 0x200E, 0x200F, 0x2028, 0x2029, 0x202A...0x202E, 0x2066...0x2069: return true
        default: return false
        }
    }

    /// Whether `text` holds any character `isControl` names.
    public static func appear(in text: String) -> Bool {
        text.unicodeScalars.contains(where: isControl)
    }

    /// `text` with each control character written as a visible escape (`\x1b`, `\r`, `\u{202e}`); text without one
    /// comes back unchanged. A backslash stays as it is: text a store already escaped (`\x1b` in an audit row)
    /// prints once, not as `\\x1b`, and a peer that writes a literal `\x1b` only fakes the look of an escape, never
    /// a terminal action.
    public static func escaped(_ text: String) -> String {
        guard text.unicodeScalars.contains(where: isControl) else { return text }
        var result = String.UnicodeScalarView()
        for scalar in text.unicodeScalars {
            switch scalar {
            case "\n": result.append(contentsOf: "\\n".unicodeScalars)
            case "\r": result.append(contentsOf: "\\r".unicodeScalars)
            case "\t": result.append(contentsOf: "\\t".unicodeScalars)
            case _ where scalar.value <= 0xFF && isControl(scalar):
                result.append(contentsOf: "\\x\(hex(scalar.value, width: 2))".unicodeScalars)
            case _ where isControl(scalar):
                result.append(contentsOf: "\\u{\(hex(scalar.value, width: 4))}".unicodeScalars)
            default: result.append(scalar)
            }
        }
        return String(result)
    }

    /// `text` escaped and cut to at most `limit` characters (the cut is marked with `…`): what a store keeps of a
    /// string a peer chose, so one row can neither forge terminal output nor grow without bound.
    public static func bounded(_ text: String, limit: Int) -> String {
        let safe = escaped(text)
        guard safe.count > limit else { return safe }
        return String(safe.prefix(max(limit - 1, 0))) + "…"
    }

    private static func hex(_ value: UInt32, width: Int) -> String {
        let digits = String(value, radix: 16)
        return String(repeating: "0", count: max(width - digits.count, 0)) + digits
    }
}
