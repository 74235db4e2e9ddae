import Foundation
import ILSCore
import NIOCore
import NIOHTTP1

/// A request head checked and rewritten for the backend.
struct ForwardedRequest {
    var head: HTTPRequestHead
    /// The client asked to switch protocols (a WebSocket handshake): the request goes to a connection of its own
    /// that is never returned to the pool.
    var isUpgrade: Bool
    /// The request carries a body (`Content-Length` above zero, or chunked).
    var hasBody: Bool
    /// The client will not send another request on this connection.
    var clientWantsClose: Bool
}

/// The header rules of a reverse proxy, as pure functions so they can be tested without sockets.
///
/// RFC 9110 §7.6.1: a proxy removes the `Connection` header, every header it names, and the hop-by-hop headers
/// `Proxy-Connection`, `Keep-Alive`, `TE`, `Transfer-Encoding` and `Upgrade` before forwarding. Framing is then
/// re-applied by our own encoder, so the backend and the client each see one unambiguous length.
enum HeaderRewriter {
    /// Hop-by-hop headers, lowercased.
    static let hopByHop: Set<String> = [
        "connection", "keep-alive", "proxy-connection", "te", "transfer-encoding", "upgrade",
        "proxy-authorization", "proxy-authenticate", "http2-settings", "expect",
    ]

    /// Headers the gateway sets itself. A client's copy is dropped, never passed on: a client must not be able to
    /// claim an identity or an address (the trust model's "strips any copy a client sent").
    static let gatewayOwned: Set<String> = [
        "x-forwarded-for", "x-forwarded-proto", "x-forwarded-host", "x-forwarded-port", "forwarded", "x-real-ip",
        "x-ils-identity", "x-ils-identity-id",
    ]

    /// Headers a `Connection` header may not nominate for removal: dropping them would change the message's meaning
    /// (a known request-smuggling and auth-bypass trick).
    static let notNominatable: Set<String> = ["host", "content-length", "authorization", "cookie"]

    /// - Parameter fallbackHost: the `Host` sent for an HTTP/1.0 request that has none (HTTP/1.1 requires one,
    ///   RFC 9112 §3.2, and the backend is spoken to in HTTP/1.1).
    static func forwardRequest(
        _ head: HTTPRequestHead,
        client: ClientContext,
        fallbackHost: String = "localhost"
    ) -> Result<ForwardedRequest, ProxyError> {
        guard head.method != .CONNECT else { return .failure(.methodNotAllowed) }

        var target = head.uri
        var hostOverride: String?
        if !target.hasPrefix("/") {
            if target == "*", head.method == .OPTIONS {
                // RFC 9112 §3.2.4 asterisk-form, allowed for OPTIONS only.
            } else if let (authority, path) = splitAbsoluteForm(target) {
                // RFC 9112 §3.2.2: a server must accept absolute-form; its authority replaces Host.
                target = path
                hostOverride = authority
            } else {
                return .failure(.invalidTarget)
            }
        }

        let headers = head.headers
        let hosts = headers["host"]
        if hosts.count > 1 || (hosts.isEmpty && hostOverride == nil && head.version == .http1_1) {
            return .failure(.malformedRequest)
        }

        let framing: BodyFraming
        switch bodyFraming(headers, version: head.version) {
        case .success(let value): framing = value
        case .failure(let error): return .failure(error)
        }

        let connectionTokens = tokens(headers["connection"])
        // Only a WebSocket handshake may switch protocols (RFC 6455 §4.1: GET, Upgrade: websocket). Anything else,
        // h2c above all, would let a client talk past these header rules straight to the backend, so other
        // Upgrade requests are forwarded as plain requests, without their Upgrade header.
        let isUpgrade =
            head.method == .GET && connectionTokens.contains("upgrade")
            && headers["upgrade"].contains { $0.trimmingCharacters().lowercased() == "websocket" }

        var out = HTTPHeaders()
        out.reserveCapacity(headers.count + 6)
        for (name, value) in headers {
            let lower = canonical(name)
            if hopByHop.contains(lower) || gatewayOwned.contains(lower) { continue }
            if connectionTokens.contains(lower) && !notNominatable.contains(lower) { continue }
            if lower == "host", let hostOverride {
                out.add(name: "Host", value: hostOverride)
                continue
            }
            out.add(name: name, value: value)
        }
        if hosts.isEmpty { out.add(name: "Host", value: hostOverride ?? fallbackHost) }

        switch framing {
        case .chunked: out.add(name: "Transfer-Encoding", value: "chunked")
        case .contentLength: break  // kept above
        case .none:
            if head.method == .POST || head.method == .PUT || head.method == .PATCH {
                out.replaceOrAdd(name: "Content-Length", value: "0")
            }
        }
        if isUpgrade {
            out.add(name: "Connection", value: "upgrade")
            out.add(name: "Upgrade", value: "websocket")
        }

        let host = hostOverride ?? hosts.first ?? ""
        let forwardedFor = client.forwardedFor
        out.add(name: "X-Forwarded-For", value: forwardedFor)
        out.add(name: "X-Forwarded-Proto", value: client.scheme.rawValue)
        if !host.isEmpty { out.add(name: "X-Forwarded-Host", value: host) }
        out.add(
            name: "Forwarded",
            value: forwardedElement(for: forwardedFor, host: host, proto: client.scheme.rawValue)
        )
        if let identity = client.identity {
            out.add(name: "X-ILS-Identity", value: identity.name)
            out.add(name: "X-ILS-Identity-Id", value: identity.id)
        }

        var forwarded = HTTPRequestHead(version: .http1_1, method: head.method, uri: target, headers: out)
        forwarded.version = .http1_1
        return .success(
            ForwardedRequest(
                head: forwarded,
                isUpgrade: isUpgrade,
                hasBody: framing.hasBody,
                clientWantsClose: !head.isKeepAlive
            )
        )
    }

    /// The backend's response head, rewritten for the client.
    ///
    /// - Parameters:
    ///   - requestVersion: the client's HTTP version; an HTTP/1.0 client gets HTTP/1.0 framing.
    ///   - closeAfter: the gateway will close the client connection after this response, and says so.
    static func clientResponse(
        _ head: HTTPResponseHead,
        requestVersion: HTTPVersion,
        closeAfter: Bool
    ) -> HTTPResponseHead {
        let connectionTokens = tokens(head.headers["connection"])
        let isSwitch = head.status == .switchingProtocols
        var out = HTTPHeaders()
        out.reserveCapacity(head.headers.count + 1)
        for (name, value) in head.headers {
            let lower = name.lowercased()
            if isSwitch && lower == "upgrade" {
                out.add(name: name, value: value)
                continue
            }
            if hopByHop.contains(lower) { continue }
            if connectionTokens.contains(lower) && lower != "content-length" { continue }
            out.add(name: name, value: value)
        }
        if isSwitch {
            out.add(name: "Connection", value: "upgrade")
        } else if closeAfter {
            out.add(name: "Connection", value: "close")
        }
        return HTTPResponseHead(version: requestVersion, status: head.status, headers: out)
    }

    enum BodyFraming {
        case none
        case contentLength
        case chunked

        var hasBody: Bool {
            switch self {
            case .none: false
            case .contentLength, .chunked: true
            }
        }
    }

    /// RFC 9112 §6.3: a request with both Transfer-Encoding and Content-Length, or whose final transfer coding is
    /// not chunked, or with differing Content-Length values, has no trustworthy length and must be refused. These
    /// are the request-smuggling patterns; refusing them here keeps the backend from ever seeing them.
    static func bodyFraming(_ headers: HTTPHeaders, version: HTTPVersion) -> Result<BodyFraming, ProxyError> {
        let transferEncodings = tokens(headers["transfer-encoding"])
        let contentLengths = headers["content-length"].flatMap {
            $0.split(separator: ",", omittingEmptySubsequences: false)
        }
        .map { String($0).trimmingCharacters() }

        if !transferEncodings.isEmpty {
            // Exactly `chunked`: other codings would reach the backend decoded as identity.
            guard contentLengths.isEmpty, version == .http1_1, transferEncodings == ["chunked"] else {
                return .failure(.ambiguousFraming)
            }
            return .success(.chunked)
        }
        guard let first = contentLengths.first else { return .success(.none) }
        guard contentLengths.allSatisfy({ $0 == first }) else { return .failure(.ambiguousFraming) }
        guard !first.isEmpty, first.count <= 18, first.utf8.allSatisfy({ $0 >= 48 && $0 <= 57 }) else {
            return .failure(.malformedRequest)
        }
        return .success(first.utf8.allSatisfy({ $0 == 48 }) ? .none : .contentLength)
    }

    /// A header name as compared here: lowercased, with `_` read as `-`, because CGI/WSGI backends turn both into the
    /// same variable (`X_ILS_Identity` and `X-ILS-Identity` are both `HTTP_X_ILS_IDENTITY`).
    static func canonical(_ name: String) -> String {
        // Header names are tokens (RFC 9110 §5.6.2): ASCII, so a byte-wise map is exact. Most names need no change.
        let utf8 = name.utf8
        guard utf8.contains(where: { ($0 >= 0x41 && $0 <= 0x5A) || $0 == 0x5F || $0 >= 0x80 }) else { return name }
        guard utf8.allSatisfy({ $0 < 0x80 }) else { return name.lowercased().replacing("_", with: "-") }
        return String(
            unsafeUninitializedCapacity: utf8.count,
            initializingUTF8With: { buffer in
                var index = 0
                for byte in utf8 {
                    buffer[index] =
                        switch byte {
                        case 0x41...0x5A: byte | 0x20
                        case 0x5F: 0x2D
                        default: byte
                        }
                    index += 1
                }
                return index
            }
        )
    }

    /// Request trailers without the gateway-owned and hop-by-hop names: a trailer must not carry an identity either.
    static func forwardTrailers(_ trailers: HTTPHeaders?) -> HTTPHeaders? {
        guard let trailers else { return nil }
        var out = HTTPHeaders()
        for (name, value) in trailers {
            let lower = canonical(name)
            if hopByHop.contains(lower) || gatewayOwned.contains(lower) || lower == "content-length" { continue }
            out.add(name: name, value: value)
        }
        return out.isEmpty ? nil : out
    }

    /// The comma-separated tokens of a list header, lowercased and trimmed (RFC 9110 §5.6.1).
    static func tokens(_ values: [String]) -> [String] {
        var result: [String] = []
        for value in values {
            for token in value.split(separator: ",") {
                let trimmed = String(token).trimmingCharacters().lowercased()
                if !trimmed.isEmpty { result.append(trimmed) }
            }
        }
        return result
    }

    /// An RFC 7239 `Forwarded` element. IPv6 addresses are bracketed and every value is quoted.
    static func forwardedElement(for address: String, host: String, proto: String) -> String {
        let node = address.utf8.contains(UInt8(ascii: ":")) ? "\"[\(address)]\"" : address
        var element = "for=\(node)"
        if !host.isEmpty, host.utf8.allSatisfy({ $0 != UInt8(ascii: "\"") && $0 != UInt8(ascii: "\\") }) {
            element += ";host=\"\(host)\""
        }
        element += ";proto=\(proto)"
        return element
    }

    /// Splits `http://authority/path?query` into its authority and origin-form target.
    static func splitAbsoluteForm(_ target: String) -> (authority: String, path: String)? {
        let lower = target.lowercased()
        let prefixLength: Int
        if lower.hasPrefix("http://") {
            prefixLength = 7
        } else if lower.hasPrefix("https://") {
            prefixLength = 8
        } else {
            return nil
        }
        let rest = target.dropFirst(prefixLength)
        let pathStart = rest.firstIndex(where: { $0 == "/" || $0 == "?" }) ?? rest.endIndex
        let authority = String(rest[..<pathStart])
        guard !authority.isEmpty, !authority.utf8.contains(UInt8(ascii: "@")) else { return nil }
        var path = String(rest[pathStart...])
        if !path.hasPrefix("/") { path = "/" + path }
        return (authority, path)
    }
}

extension String {
    func trimmingCharacters() -> String {
        var slice = Substring(self)
        while let first = slice.first, first == " " || first == "\t" { slice = slice.dropFirst() }
        while let last = slice.last, last == " " || last == "\t" { slice = slice.dropLast() }
        return String(slice)
    }
}
