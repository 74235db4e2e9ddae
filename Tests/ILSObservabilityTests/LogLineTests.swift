import Foundation
import ILSObservability
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// The one format every log line of the binary is written in.
@Suite("Log lines, text and JSON")
struct LogLineTests {
    /// 2026-11-24T05:30:07.089 UTC.
    static let time = timespec(tv_sec: 1_795_498_207, tv_nsec: 89_999_999)

    static func text(_ fields: [(key: String, value: String)]) -> String {
        let bytes = LogLine.encode(
            format: .text,
            level: "info",
            label: "ils-gateway",
            message: "access",
            fields: fields,
            time: time
        )
        return String(decoding: bytes, as: UTF8.self)
    }

    @Test("text: UTC timestamp to the millisecond, level, label, message, then the fields in the order given")
    func textLine() {
        #expect(
            Self.text([("bytes_in", "0"), ("method", "GET"), ("status", "200")])
                == "2026-11-24T05:30:07.089 info ils-gateway: access bytes_in=0 method=GET status=200\n"
        )
    }

    @Test("text: a value that is empty or holds a space, quote, = or control character is quoted and escaped")
    func textQuoting() {
        let line = Self.text([
            ("a", ""), ("b", "two words"), ("c", #"say "hi" \ bye"#), ("d", "k=v"), ("e", "one\ntwo\u{7}"),
        ])
        #expect(
            line.hasSuffix(
                #" access a="" b="two words" c="say \"hi\" \\ bye" d="k=v" e="one\ntwo?""# + "\n"
            )
        )
        #expect(line.filter { $0 == "\n" }.count == 1, "a value must never break the line")
    }

    @Test("json: one object per line that parses back to the same fields; reserved names cannot be shadowed")
    func jsonLine() throws {
        let fields: [(key: String, value: String)] = [
            ("client", "127.0.0.1"), ("level", "fake"), ("path", "/a\tb\u{1}"), ("ts", "fake"),
        ]
        let bytes = LogLine.encode(
            format: .json,
            level: "warning",
            label: "ils-gateway",
            message: "said \"no\"",
            fields: fields,
            time: Self.time
        )
        #expect(bytes.last == UInt8(ascii: "\n"))
        #expect(bytes.filter { $0 == UInt8(ascii: "\n") }.count == 1)
        let object = try #require(try JSONSerialization.jsonObject(with: Data(bytes)) as? [String: String])
        #expect(
            object == [
                "ts": "2026-11-24T05:30:07.089", "level": "warning", "logger": "ils-gateway", "msg": "said \"no\"",
                "client": "127.0.0.1", "path": "/a\tb\u{1}",
            ]
        )
    }
}
