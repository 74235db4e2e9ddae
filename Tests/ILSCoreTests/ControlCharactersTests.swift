import ILSCore
import Testing

@Suite("Control characters are shown, never obeyed")
struct ControlCharactersTests {
    @Test("ESC, CSI, CR, BEL, DEL, C1 and bidi overrides print as visible escapes")
    func hostileTextIsEscaped() {
        let hostile = "gw\u{1b}[2J\u{1b}[1;1Hadmin  identity.revoke  ipad\r\u{07}\u{7f}\u{9b}31m\u{202e}x\u{2028}"
        let shown = ControlCharacters.escaped(hostile)
        #expect(shown == #"gw\x1b[2J\x1b[1;1Hadmin  identity.revoke  ipad\r\x07\x7f\x9b31m\u{202e}x\u{2028}"#)
        #expect(!ControlCharacters.appear(in: shown))
        #expect(ControlCharacters.appear(in: hostile))
    }

    @Test(
        "plain text, Unicode names and text escaped before (backslashes) come back unchanged"
    )
    func plainTextIsUnchanged() {
        #expect(ControlCharacters.escaped("ipad-2.home_Zoë 東京") == "ipad-2.home_Zoë 東京")
        #expect(ControlCharacters.escaped(#"a\x1b"#) == #"a\x1b"#)
    }

    @Test("bounded keeps at most the limit, escapes counted, and marks the cut")
    func boundedCutsAfterEscaping() {
        let cut = ControlCharacters.bounded(String(repeating: "\u{1b}", count: 100), limit: 10)
        #expect(cut.count == 10)
        #expect(cut.hasSuffix("…"))
        #expect(!ControlCharacters.appear(in: cut))
        #expect(ControlCharacters.bounded("short", limit: 10) == "short")
    }
}
