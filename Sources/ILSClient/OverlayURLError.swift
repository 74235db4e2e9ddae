public import Foundation
import ILSCore
import ILSFabric
import NIOCore
import NIOHTTP2

#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// How the overlay's failures reach an app: as the `URLError`s its URLSession code already handles, each carrying
/// the overlay's stable reason code (`identity_blocked`, `unknown_service`, ...) under `ilsReasonKey`.
///
/// | reason                   | URLError code                 | when                                               |
/// |--------------------------|-------------------------------|----------------------------------------------------|
/// | `controller_unreachable` | `.cannotConnectToHost`        | no connection to the controller                    |
/// | `identity_blocked`       | `.userAuthenticationRequired` | the identity is revoked, disabled or deleted       |
/// | `identity_expired`       | `.userAuthenticationRequired` | its certificate expired before it renewed: enroll  |
/// |                          |                               | again with a new token from the admin              |
/// | `unknown_service`        | `.cannotFindHost`             | no such service                                    |
/// | `dial_denied`, ...       | `.resourceUnavailable`        | policy refuses this identity the service           |
/// | `service_unavailable`    | `.cannotConnectToHost`        | no gateway hosts the service now                   |
/// | `gateway_denied`         | `.resourceUnavailable`        | the gateway refused the end-to-end handshake       |
/// | `truncated`              | `.networkConnectionLost`      | the circuit ended or failed before the response did |
/// | `not_resumed`            | `.networkConnectionLost`      | the path was lost and the circuit could not be      |
/// |                          |                               | resumed (grace window over, gateway restarted)     |
/// | `timed_out`              | `.timedOut`                   | nothing arrived for the request's timeout interval |
public enum OverlayURLError {
    /// The `userInfo` key of the overlay's reason code (a `String`).
    public static let reasonKey = "ILSReason"

    /// The `URLError` for the overlay reason `code`, with a sentence for a person.
    public static func make(code: String, reason: String, url: URL?) -> URLError {
        var info: [String: Any] = [reasonKey: code, NSLocalizedDescriptionKey: reason]
        if let url { info[NSURLErrorFailingURLErrorKey] = url }
        return URLError(urlErrorCode(for: code), userInfo: info)
    }

    static func urlErrorCode(for code: String) -> URLError.Code {
        switch code {
        case "controller_unreachable", "service_unavailable": .cannotConnectToHost
        case "identity_blocked", "identity_expired": .userAuthenticationRequired
        case "unknown_service": .cannotFindHost
        case "timed_out": .timedOut
        case "truncated", "closed", "not_resumed": .networkConnectionLost
        case "cancelled": .cancelled
        default: .resourceUnavailable
        }
    }

    /// Maps whatever a circuit failed with. Anything that is not a refusal (a reset stream, a failed record, the
    /// connection lost) ends the response early, which an app must never take for a complete answer: it is
    /// `truncated`, i.e. `.networkConnectionLost`.
    static func make(_ error: any Error, url: URL?) -> URLError {
        switch error {
        case let error as URLError:
            return error
        case OverlayDialer.DialError.controllerUnreachable(let reason):
            return make(code: "controller_unreachable", reason: reason, url: url)
        case OverlayDialer.DialError.refused(let code, let reason):
            return make(code: safeCode(code), reason: ControlCharacters.bounded(reason, limit: 300), url: url)
        case let refused as E2EInitiatorHandler.Refused:
            return make(
                code: "gateway_denied",
                reason: "the gateway refused the circuit: \(ControlCharacters.bounded(refused.reason, limit: 300))",
                url: url
            )
        case let failed as E2ECircuitError where failed.code == E2ECircuitError.notResumed.code:
            // Its own reason: the app may offer to ask again, knowing the answer did not end and was not cut.
            return make(code: "not_resumed", reason: ControlCharacters.bounded(failed.reason, limit: 300), url: url)
        case let refused as E2ECircuitError where E2ECircuitError.refusedCodes.contains(refused.code):
            // The controller ended it: the identity was blocked, or the policy no longer lets it dial the service.
            return make(code: refused.code, reason: ControlCharacters.bounded(refused.reason, limit: 300), url: url)
        case is CancellationError:
            return make(code: "cancelled", reason: "the request was cancelled", url: url)
        default:
            return make(code: "truncated", reason: "the circuit ended before the response was complete", url: url)
        }
    }
}

extension OverlayURLError {
    /// A code from the network as an app may match on it: lower-case letters and `_`, at most 64 of them;
    /// anything else is reported as `refused`.
    static func safeCode(_ code: String) -> String {
        let allowed = code.utf8.allSatisfy {
            ($0 >= UInt8(ascii: "a") && $0 <= UInt8(ascii: "z")) || $0 == UInt8(ascii: "_")
        }
        return allowed && !code.isEmpty && code.utf8.count <= 64 ? code : "refused"
    }
}

extension URLError {
    /// The overlay's reason code (`identity_blocked`, `unknown_service`, `truncated`, ...) when this error came
    /// from ILSClient, nil otherwise.
    public var ilsReason: String? { userInfo[OverlayURLError.reasonKey] as? String }
}
