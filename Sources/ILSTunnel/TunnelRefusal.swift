import Foundation
import ILSDial
import ILSFabric
import NIOCore
import NIOHTTP1

/// What a local client hears when its circuit cannot be opened or the gateway refuses it: an HTTP/1.1 response in
/// the gateway's JSON error format (`{"error": "<sentence>", "code": "<stable_code>"}`, docs/http-mode.md), so
/// `curl` and an app show why (`identity_blocked`, `service_unavailable`, …) instead of an empty reply. The tunnel
/// carries bytes, not HTTP, but every client of a service the overlay fronts speaks HTTP/1.1.
struct TunnelRefusal: Equatable {
    let status: Int
    let code: String
    let reason: String

    init(status: Int, code: String, reason: String) {
        self.status = status
        self.code = code
        self.reason = reason
    }

    /// The answer for a circuit that failed to open.
    init(_ error: any Error) {
        switch error {
        case OverlayDialer.DialError.controllerUnreachable(let reason):
            self.init(status: 502, code: "controller_unreachable", reason: reason)
        case OverlayDialer.DialError.refused(let code, let reason):
            self.init(status: Self.status(of: code), code: code, reason: reason)
        case let refused as E2EInitiatorHandler.Refused:
            self.init(status: 403, code: "gateway_denied", reason: refused.reason)
        default:
            self.init(status: 502, code: "circuit_failed", reason: "the circuit could not be opened: \(error)")
        }
    }

    /// The HTTP status for a refusal code of the controller or the gateway (docs/protocol.md, "Refusals").
    static func status(of code: String) -> Int {
        switch code {
        case "identity_blocked", "dial_denied", "permission_denied": 403
        case "unknown_service": 404
        case "circuit_limit", "circuit_rate": 429
        case "service_unavailable": 503
        case "internal_error": 500
        default: 502
        }
    }

    /// A JSON string literal of `text` (JSONEncoder escapes it).
    private static func quoted(_ text: String) -> String? {
        (try? JSONEncoder().encode(text)).map { String(decoding: $0, as: UTF8.self) }
    }

    /// The whole response: status line, headers, JSON body. The body's keys come in the gateway's order (`error`,
    /// then `code`), written out here: JSONEncoder's key order for a struct is not fixed on Linux.
    var response: String {
        let json = Self.quoted(reason).flatMap { error in
            Self.quoted(code).map { #"{"error":"# + error + #","code":"# + $0 + "}" }
        }
        let body = (json ?? #"{"error":"the circuit was refused","code":"refused"}"#) + "\n"
        let phrase = HTTPResponseStatus(statusCode: status).reasonPhrase
        return
            "HTTP/1.1 \(status) \(phrase)\r\nContent-Type: application/json\r\nContent-Length: \(body.utf8.count)\r\n"
            + "Connection: close\r\nCache-Control: no-store\r\n\r\n" + body
    }

    /// How long a refused client has to read the answer and hang up before its connection is closed anyway.
    static let lingering: TimeAmount = .seconds(2)

    /// Writes the answer, ends the output, and closes once the client has hung up (or after `lingering`): closing at
    /// once, with the client's request still unread in the socket, would make the kernel send a reset that can
    /// overtake the answer.
    func send(to channel: any Channel) {
        guard channel.isActive else { return }
        let closer = channel.eventLoop.scheduleTask(in: Self.lingering) { channel.close(promise: nil) }
        channel.closeFuture.whenComplete { _ in closer.cancel() }
        channel.writeAndFlush(ByteBuffer(string: response)).flatMap {
            channel.close(mode: .output)
        }.whenFailure { _ in channel.close(promise: nil) }
    }
}
