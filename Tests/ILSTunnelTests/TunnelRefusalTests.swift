import Foundation
import ILSClient
import Testing

@testable import ILSFabric
@testable import ILSTunnel

/// What a local client is told when its circuit is refused: the status for each refusal code and the response's
/// exact bytes (docs/protocol.md, "Refusals"; the gateway's JSON error format, docs/http-mode.md).
@Suite("TunnelRefusal: the answer a local client gets for a refused circuit")
struct TunnelRefusalTests {
    @Test(
        "each refusal code of the controller or the gateway maps to its HTTP status",
        arguments: [
            ("identity_blocked", 403), ("dial_denied", 403), ("permission_denied", 403), ("unknown_service", 404),
            ("service_unavailable", 503), ("internal_error", 500), ("closed", 502), ("a_code_not_known_yet", 502),
        ]
    )
    func statusOfEachCode(code: String, status: Int) {
        #expect(TunnelRefusal.status(of: code) == status)
        let refusal = TunnelRefusal(OverlayDialer.DialError.refused(code: code, reason: "why"))
        #expect(refusal == TunnelRefusal(status: status, code: code, reason: "why"))
    }

    @Test("an unreachable controller is 502 controller_unreachable, with the reason")
    func controllerUnreachable() {
        let refusal = TunnelRefusal(OverlayDialer.DialError.controllerUnreachable("cannot reach the controller"))
        #expect(
            refusal == TunnelRefusal(status: 502, code: "controller_unreachable", reason: "cannot reach the controller")
        )
    }

    @Test("a gateway's end-to-end refusal is 403 gateway_denied, with the gateway's reason")
    func gatewayRefusal() {
        let refusal = TunnelRefusal(E2EInitiatorHandler.Refused(reason: "'ipad' may not dial claude-api"))
        #expect(refusal == TunnelRefusal(status: 403, code: "gateway_denied", reason: "'ipad' may not dial claude-api"))
    }

    @Test("any other failure is 502 circuit_failed")
    func otherFailure() {
        struct Broken: Error {}
        let refusal = TunnelRefusal(Broken())
        #expect(refusal.status == 502)
        #expect(refusal.code == "circuit_failed")
    }

    @Test("the response is HTTP/1.1 with the status's reason phrase, an exact Content-Length and the JSON error body")
    func responseBytes() throws {
        let response = TunnelRefusal(status: 404, code: "unknown_service", reason: "there is no service named 'x'")
            .response
        let (head, body) = try split(response)
        #expect(head.first == "HTTP/1.1 404 Not Found")
        #expect(
            Array(head.dropFirst()) == [
                "Content-Type: application/json", "Content-Length: \(body.utf8.count)", "Connection: close",
                "Cache-Control: no-store",
            ]
        )
        let decoded = try JSONDecoder().decode([String: String].self, from: Data(body.utf8))
        #expect(decoded == ["error": "there is no service named 'x'", "code": "unknown_service"])
        // The gateway's key order, which clients that match on the body's start rely on.
        #expect(body.hasPrefix(#"{"error":""#))
    }

    @Test("a reason with quotes and line breaks stays inside the JSON body: no header is injected")
    func reasonCannotInjectHeaders() throws {
        let reason = "bad\"\r\nX-Injected: yes\r\n\r\n{\"code\":\"fake\"}"
        let (head, body) = try split(TunnelRefusal(status: 403, code: "dial_denied", reason: reason).response)
        #expect(!head.contains { $0.hasPrefix("X-Injected") })
        let decoded = try JSONDecoder().decode([String: String].self, from: Data(body.utf8))
        #expect(decoded == ["error": reason, "code": "dial_denied"])
    }

    /// The head's lines and the body of a response.
    private func split(_ response: String) throws -> (head: [String], body: String) {
        let end = try #require(response.range(of: "\r\n\r\n"))
        let head = response[..<end.lowerBound].components(separatedBy: "\r\n")
        return (head, String(response[end.upperBound...]))
    }
}
