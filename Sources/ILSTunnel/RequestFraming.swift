import NIOCore

/// A request head as a local client sent it to the tunnel: only what the tunnel's checks and its framing need.
struct TunnelRequestHead: Equatable, Sendable {
    var method: String
    var target: String
    var version: String
    /// Field names lowercased, values trimmed, in the order sent.
    var fields: [(name: String, value: String)]

    func values(_ name: String) -> [String] {
        fields.filter { $0.name == name }.map(\.value)
    }

    static func == (lhs: Self, rhs: Self) -> Bool {
        lhs.method == rhs.method && lhs.target == rhs.target && lhs.version == rhs.version
            && lhs.fields.elementsEqual(rhs.fields) { $0 == $1 }
    }
}

/// Finds the request heads in the bytes a local client sends the tunnel, so each request is checked before it goes
/// into the circuit, while every byte goes on unchanged.
///
/// Written here rather than with NIOHTTP1's `HTTPRequestDecoder`: the decoder turns bytes into parts, and the tunnel
/// would then have to encode them again, which changes what the gateway reads (chunk boundaries, header spelling) and
/// loses the byte stream an upgraded connection (a WebSocket) needs. This only tracks message boundaries
/// (RFC 9112 §6: `Content-Length`, `chunked`), and it is stricter than the gateway: whatever the two might read
/// differently (both framing headers, two lengths, a bare LF, a folded line, a coding other than `chunked`) is
/// refused here, so a request can never be hidden inside what the tunnel took for a body.
struct RequestFraming {
    enum Step: Equatable {
        /// A whole request head and its bytes, to be checked before they are forwarded.
        case head(TunnelRequestHead, ByteBuffer)
        /// Bytes of a body (or of an upgraded connection) to forward as they are.
        case forward(ByteBuffer)
    }

    struct Malformed: Error, Equatable {
        var status: Int
        var code: String
        var reason: String
    }

    /// The gateway's own limit on a request head (`ProxyConfiguration`), so nothing it would take is refused here.
    static let maximumHeadBytes = 64 * 1024
    static let maximumChunkLineBytes = 4096

    private enum State {
        case head
        case body(remaining: Int)
        case chunkLine
        case chunkData(remaining: Int)
        case chunkDataEnd(seen: Int)
        case trailers(bytes: Int)
        /// After an upgrade: the rest is not HTTP.
        case passThrough
        case failed
    }

    private var state = State.head
    /// The head, chunk-size line or trailer line being gathered.
    private var pending = ByteBuffer()

    /// The steps for `input`, in order. After a `Malformed` nothing more is read.
    mutating func feed(_ input: ByteBuffer) throws(Malformed) -> [Step] {
        var input = input
        var steps: [Step] = []
        var forwarded: ByteBuffer?
        func forward(_ bytes: ByteBuffer) {
            if forwarded == nil { forwarded = bytes } else { forwarded!.writeImmutableBuffer(bytes) }
        }
        func flush() {
            if let bytes = forwarded, bytes.readableBytes > 0 { steps.append(.forward(bytes)) }
            forwarded = nil
        }
        do throws(Malformed) {
            while input.readableBytes > 0 {
                switch state {
                case .failed:
                    return steps
                case .passThrough:
                    forward(input.readSlice(length: input.readableBytes)!)
                case .body(let remaining):
                    let count = min(remaining, input.readableBytes)
                    forward(input.readSlice(length: count)!)
                    state = remaining == count ? .head : .body(remaining: remaining - count)
                case .chunkData(let remaining):
                    let count = min(remaining, input.readableBytes)
                    forward(input.readSlice(length: count)!)
                    state = remaining == count ? .chunkDataEnd(seen: 0) : .chunkData(remaining: remaining - count)
                case .chunkDataEnd(let seen):
                    let byte = input.readInteger(as: UInt8.self)!
                    guard byte == (seen == 0 ? UInt8(ascii: "\r") : UInt8(ascii: "\n")) else {
                        throw Malformed.framing("a chunk's data is not followed by CRLF")
                    }
                    forward(ByteBuffer(bytes: [byte]))
                    state = seen == 0 ? .chunkDataEnd(seen: 1) : .chunkLine
                case .chunkLine, .trailers:
                    guard let line = try takeLine(from: &input) else { break }
                    forward(line)
                    try endOfLine(line)
                case .head:
                    guard let (head, bytes) = try takeHead(from: &input) else { break }
                    flush()
                    steps.append(.head(head, bytes))
                }
            }
        } catch {
            state = .failed
            throw error
        }
        flush()
        return steps
    }

    /// A chunk-size or trailer line ends: move on from it.
    private mutating func endOfLine(_ line: ByteBuffer) throws(Malformed) {
        let text = String(decoding: line.readableBytesView.dropLast(2), as: UTF8.self)
        if case .trailers(let bytes) = state {
            let total = bytes + line.readableBytes
            guard total <= Self.maximumHeadBytes else {
                throw Malformed.framing("the chunked body's trailers are too large")
            }
            state = text.isEmpty ? .head : .trailers(bytes: total)
            return
        }
        // chunk-size [ chunk-ext ] CRLF, chunk-size = 1*HEXDIG (RFC 9112 §7.1)
        let digits = text.prefix { $0.isHexDigit }
        let rest = text.dropFirst(digits.count)
        guard !digits.isEmpty, digits.count <= 15, rest.isEmpty || rest.first == ";",
            let size = Int(digits, radix: 16)
        else {
            throw Malformed.framing("a chunk size is not a hexadecimal number")
        }
        state = size == 0 ? .trailers(bytes: 0) : .chunkData(remaining: size)
    }

    /// A whole line (with its CRLF) of a chunked body, or nil when `input` ended first (kept in `pending`).
    private mutating func takeLine(from input: inout ByteBuffer) throws(Malformed) -> ByteBuffer? {
        let view = input.readableBytesView
        guard let newline = view.firstIndex(of: UInt8(ascii: "\n")) else {
            pending.writeBuffer(&input)
            guard pending.readableBytes <= Self.maximumChunkLineBytes else {
                throw Malformed.framing("a line of the chunked body is too long")
            }
            return nil
        }
        var part = input.readSlice(length: newline - view.startIndex + 1)!
        pending.writeBuffer(&part)
        let line = pending
        pending = ByteBuffer()
        let bytes = line.readableBytesView
        guard bytes.count >= 2, bytes[bytes.endIndex - 2] == UInt8(ascii: "\r"),
            !bytes.dropLast(2).contains(UInt8(ascii: "\r")), bytes.count <= Self.maximumChunkLineBytes
        else {
            throw Malformed.framing("a line of the chunked body does not end in CRLF")
        }
        return line
    }

    /// A whole head and its bytes, or nil when `input` ended first (kept in `pending`).
    private mutating func takeHead(from input: inout ByteBuffer) throws(Malformed) -> (TunnelRequestHead, ByteBuffer)? {
        let searchFrom = max(0, pending.readableBytes - 3)
        pending.writeBuffer(&input)
        let view = pending.readableBytesView
        var end: Int?
        var index = view.startIndex + searchFrom
        while index + 3 < view.endIndex {
            if view[index + 3] == UInt8(ascii: "\n"), view[index + 2] == UInt8(ascii: "\r"),
                view[index + 1] == UInt8(ascii: "\n"), view[index] == UInt8(ascii: "\r")
            {
                end = index + 4 - view.startIndex
                break
            }
            index += 1
        }
        guard let end else {
            guard pending.readableBytes <= Self.maximumHeadBytes else {
                throw Malformed(status: 431, code: "headers_too_large", reason: "the request head is too large")
            }
            return nil
        }
        guard end <= Self.maximumHeadBytes else {
            throw Malformed(status: 431, code: "headers_too_large", reason: "the request head is too large")
        }
        let bytes = pending.readSlice(length: end)!
        // What follows the head is read again under the state the head sets.
        input = pending
        pending = ByteBuffer()
        let head = try Self.parse(bytes)
        state = try Self.framing(after: head)
        return (head, bytes)
    }

    /// The state after a head: its body, if any, or the rest of the connection for an upgrade.
    private static func framing(after head: TunnelRequestHead) throws(Malformed) -> State {
        let codings = head.values("transfer-encoding")
        let lengths = head.values("content-length")
        let connection = head.values("connection").flatMap { $0.lowercased().split(separator: ",") }
        let upgrade =
            !head.values("upgrade").isEmpty && connection.contains { $0.trimmingSpaces == "upgrade" }
        if !codings.isEmpty {
            guard lengths.isEmpty else {
                throw Malformed.framing("the request has both Content-Length and Transfer-Encoding")
            }
            guard codings.count == 1, codings[0].lowercased() == "chunked" else {
                throw Malformed.framing("the only transfer coding taken is chunked")
            }
            return upgrade ? .passThrough : .chunkLine
        }
        guard let first = lengths.first else { return upgrade ? .passThrough : .head }
        guard lengths.allSatisfy({ $0 == first }), !first.isEmpty, first.count <= 18,
            first.utf8.allSatisfy({ (UInt8(ascii: "0")...UInt8(ascii: "9")).contains($0) }), let length = Int(first)
        else {
            throw Malformed.framing("the request's Content-Length is not one decimal number")
        }
        if upgrade { return .passThrough }
        return length == 0 ? .head : .body(remaining: length)
    }

    /// The request line and the fields of a head (RFC 9112 §3, §5), refusing what a lenient parser might read
    /// another way.
    static func parse(_ bytes: ByteBuffer) throws(Malformed) -> TunnelRequestHead {
        let text = String(buffer: bytes)
        guard text.utf8.allSatisfy({ $0 != 0 }) else { throw Malformed.bad("the request head holds a NUL byte") }
        var lines = text.split(separator: "\r\n", omittingEmptySubsequences: false)
        // RFC 9112 §2.2: empty lines before a request line are ignored.
        while lines.first?.isEmpty == true { lines.removeFirst() }
        guard lines.allSatisfy({ !$0.contains("\r") && !$0.contains("\n") }) else {
            throw Malformed.bad("a line of the request head does not end in CRLF")
        }
        guard let requestLine = lines.first, !requestLine.isEmpty else {
            throw Malformed.bad("the request has no request line")
        }
        let parts = requestLine.split(separator: " ", omittingEmptySubsequences: false)
        guard parts.count == 3, !parts[0].isEmpty, parts[0].allSatisfy(\.isTokenCharacter), !parts[1].isEmpty else {
            throw Malformed.bad("the request line is not METHOD TARGET VERSION")
        }
        guard parts[2] == "HTTP/1.1" || parts[2] == "HTTP/1.0" else {
            // 400, as the gateway answers it, so a client sees one answer whichever of the two refuses first.
            throw Malformed.bad("the tunnel takes HTTP/1.1 and HTTP/1.0")
        }
        var fields: [(name: String, value: String)] = []
        for line in lines.dropFirst() where !line.isEmpty {
            guard line.first != " ", line.first != "\t" else {
                throw Malformed.bad("a header line is folded (obsolete line folding)")
            }
            guard let colon = line.firstIndex(of: ":"), colon != line.startIndex,
                line[..<colon].allSatisfy(\.isTokenCharacter)
            else {
                throw Malformed.bad("a header line is not NAME: VALUE")
            }
            fields.append((line[..<colon].lowercased(), String(line[line.index(after: colon)...]).trimmingSpaces))
        }
        return TunnelRequestHead(
            method: String(parts[0]),
            target: String(parts[1]),
            version: String(parts[2]),
            fields: fields
        )
    }
}

extension RequestFraming.Malformed {
    static func bad(_ reason: String) -> Self { Self(status: 400, code: "malformed_request", reason: reason) }
    static func framing(_ reason: String) -> Self { Self(status: 400, code: "ambiguous_framing", reason: reason) }
}

extension Character {
    /// RFC 9110 §5.6.2 tchar.
    fileprivate var isTokenCharacter: Bool {
        guard let ascii = asciiValue, ascii > 32, ascii < 127 else { return false }
        return !"\"(),/:;<=>?@[\\]{}".contains(self)
    }
}

extension StringProtocol {
    /// Without leading and trailing spaces and tabs (optional whitespace, RFC 9110 §5.6.3).
    fileprivate var trimmingSpaces: String {
        let isSpace: (Character) -> Bool = { $0 == " " || $0 == "\t" }
        guard let start = firstIndex(where: { !isSpace($0) }), let end = lastIndex(where: { !isSpace($0) }) else {
            return ""
        }
        return String(self[start...end])
    }
}
