import NIOCore
public import NIOHTTP1

/// An answer the gateway gives itself, instead of the backend: a status and a JSON body
/// `{"error": "<one sentence>", "code": "<stable_code>"}`.
///
/// Codes are API (clients and tests match on them); sentences are for people and never contain request data.
public struct ProxyError: Error, Hashable, Sendable {
    public let status: HTTPResponseStatus
    public let code: String
    public let reason: String

    public init(status: HTTPResponseStatus, code: String, reason: String) {
        self.status = status
        self.code = code
        self.reason = reason
    }

    static let backendUnreachable = ProxyError(
        status: .badGateway,
        code: "backend_unreachable",
        reason: "The backend could not be reached; check that it is running."
    )
    static let backendReset = ProxyError(
        status: .badGateway,
        code: "backend_reset",
        reason: "The backend closed the connection before sending a response."
    )
    static let backendInvalidResponse = ProxyError(
        status: .badGateway,
        code: "backend_invalid_response",
        reason: "The backend sent a response that is not valid HTTP/1.1."
    )
    static let backendTimeout = ProxyError(
        status: .gatewayTimeout,
        code: "backend_timeout",
        reason: "The backend did not send response headers in time."
    )
    static let backendBusy = ProxyError(
        status: .serviceUnavailable,
        code: "backend_busy",
        reason: "Every connection to the backend is busy; retry shortly."
    )
    static let malformedRequest = ProxyError(
        status: .badRequest,
        code: "malformed_request",
        reason: "The request is not valid HTTP/1.1."
    )
    static let headersTooLarge = ProxyError(
        status: .requestHeaderFieldsTooLarge,
        code: "headers_too_large",
        reason: "The request headers are too large."
    )
    static let ambiguousFraming = ProxyError(
        status: .badRequest,
        code: "ambiguous_framing",
        reason: "The request's Content-Length and Transfer-Encoding headers disagree, so its length is ambiguous."
    )
    static let invalidTarget = ProxyError(
        status: .badRequest,
        code: "invalid_target",
        reason: "The request target must be an absolute path such as /health."
    )
    static let methodNotAllowed = ProxyError(
        status: .methodNotAllowed,
        code: "method_not_allowed",
        reason: "CONNECT is not supported: this is a reverse proxy, not a forward proxy."
    )
    /// RFC 9110 §15.5.9: the client stopped sending its request body for longer than the idle timeout.
    static let requestBodyTimeout = ProxyError(
        status: .requestTimeout,
        code: "request_timeout",
        reason: "The request body stopped arriving before it was complete."
    )
    static let shuttingDown = ProxyError(
        status: .serviceUnavailable,
        code: "shutting_down",
        reason: "The gateway is shutting down; retry shortly."
    )

    /// The response body, built by hand so that no encoder can reorder or escape it differently between versions.
    func jsonBody(allocator: ByteBufferAllocator) -> ByteBuffer {
        var buffer = allocator.buffer(capacity: 64 + reason.utf8.count)
        buffer.writeString("{\"error\":\"")
        buffer.writeString(reason.jsonEscaped)
        buffer.writeString("\",\"code\":\"")
        buffer.writeString(code.jsonEscaped)
        buffer.writeString("\"}\n")
        return buffer
    }
}

extension String {
    /// Escapes a string for a JSON string literal (RFC 8259 §7).
    var jsonEscaped: String {
        var out = ""
        out.reserveCapacity(utf8.count)
        for scalar in unicodeScalars {
            switch scalar {
            case "\"": out += "\\\""
            case "\\": out += "\\\\"
            case "\n": out += "\\n"
            case "\r": out += "\\r"
            case "\t": out += "\\t"
            case _ where scalar.value < 0x20:
                let hex = String(scalar.value, radix: 16)
                out += "\\u" + String(repeating: "0", count: 4 - hex.count) + hex
            default: out.unicodeScalars.append(scalar)
            }
        }
        return out
    }
}
