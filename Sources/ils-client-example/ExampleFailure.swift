import Foundation
import ILSClient
import ILSCore

#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// A failed request as the example reports it: one sentence, and an exit status per kind of failure.
struct ExampleFailure: Error {
    let sentence: String
    let status: Int32

    init(sentence: String, status: Int32) {
        self.sentence = sentence
        self.status = status
    }

    /// An overlay failure: its sentence and its reason code, which picks the status.
    init(_ error: URLError) {
        let reason = error.ilsReason ?? "network_error"
        let sentence = (error.userInfo[NSLocalizedDescriptionKey] as? String) ?? "the request failed"
        self.init(sentence: "\(ControlCharacters.escaped(sentence)) (\(reason))", status: Self.status(of: reason))
    }

    /// The service answered with an HTTP error: the gateway's JSON `code`, or the body's first line.
    init(status: Int, body: Data) {
        struct GatewayError: Decodable {
            let error: String
            let code: String
        }
        let detail: String
        if let refusal = try? JSONDecoder().decode(GatewayError.self, from: body) {
            detail = "\(refusal.error) (\(refusal.code))"
        } else {
            detail =
                String(decoding: body.prefix(200), as: UTF8.self).split(separator: "\n").first.map(String.init) ?? ""
        }
        self.init(
            sentence: "the service answered HTTP \(status): \(ControlCharacters.escaped(detail))",
            status: 76
        )
    }

    static func status(of reason: String) -> Int32 {
        switch reason {
        case "controller_unreachable", "service_unavailable": 69
        case "unknown_service": 67
        case "identity_blocked", "dial_denied", "permission_denied", "gateway_denied": 77
        case "timed_out": 75
        default: 74
        }
    }
}
