/// How an established circuit ended badly, as the end-to-end layer reports it to the layer above (the app's
/// channel, the tunnel, the gateway's proxy core) through `errorCaught`.
///
/// The relay and the network are not trusted to say how a circuit ended: END_STREAM and RST_STREAM are unsigned
/// HTTP/2 frames that any hop can send. Only the peer's FINAL record, sealed under the circuit's key, says "this
/// direction ended here, on purpose". A direction that ends any other way was cut, and everything that came
/// before may be a prefix of what was sent.
public struct E2ECircuitError: Error, Sendable, Hashable, CustomStringConvertible {
    /// A stable identifier: code matches on it (`truncated`).
    public let code: String
    /// One sentence for a person.
    public let reason: String

    /// The peer's direction ended (END_STREAM, RST_STREAM or a lost connection) without its FINAL record: what was
    /// received may be incomplete and must not be taken as a whole message.
    public static let truncated = E2ECircuitError(
        code: "truncated",
        reason: "the circuit ended without the peer's final record: what was received may be incomplete"
    )

    /// The device gave up on the circuit: its sealed CANCEL record (suite 4) ended its direction. Only the device
    /// sends it; the gateway stops the backend's work at once.
    public static let cancelled = E2ECircuitError(
        code: "cancelled",
        reason: "the device cancelled the circuit"
    )

    /// A resumable circuit's path was lost and no new one came within the grace window: the other end's work on it
    /// was given up (the gateway cancels the backend request). Not `truncated`: nothing was cut short by the peer.
    public static let notResumed = E2ECircuitError(
        code: "not_resumed",
        reason: "the circuit's path was lost and it could not be resumed within the grace window"
    )

    /// The circuit could not be resumed, for `reason` (the gateway no longer holds it, it refused, the window ran out).
    public static func notResumed(because reason: String) -> E2ECircuitError {
        E2ECircuitError(code: "not_resumed", reason: "the circuit could not be resumed: \(reason)")
    }

    /// The controller ended the circuit because its identity may no longer use it: `code` is the relay's
    /// (`identity_blocked`: revoked, disabled or deleted; `dial_denied`: the service's dial policy no longer allows
    /// it), `reason` its words. Not `not_resumed`: asking again will not help until an administrator acts.
    public static func refused(code: String, reason: String) -> E2ECircuitError {
        E2ECircuitError(code: code, reason: reason)
    }

    /// Relay codes that `refused` carries as they are: a held circuit refused with one of them ends with it.
    public static let refusedCodes: Set<String> = ["identity_blocked", "dial_denied"]

    public var description: String { reason }
}
