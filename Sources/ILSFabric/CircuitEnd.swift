import NIOCore
import NIOHTTP2

/// How the peer's direction of an established circuit ends, as one end-to-end handler sees it.
///
/// Only the peer's FINAL record is a clean end: it is sealed under the circuit's key, so no relay can forge or
/// drop it undetected. END_STREAM and RST_STREAM are the relay's to send, and the connection can die under the
/// circuit; such an end, unless this side closed the circuit first, is reported once as
/// `E2ECircuitError.truncated`.
struct CircuitEnd {
    /// The peer's FINAL record has been opened: its direction ended here, on purpose.
    private(set) var peerFinished = false
    /// This side closed the whole circuit: whatever follows (a reset, the stream closing) is its own doing.
    private(set) var closedLocally = false
    private var reported = false

    mutating func finalReceived() { peerFinished = true }

    mutating func closing() { closedLocally = true }

    /// Whether an end of the peer's direction seen now must be reported as a truncation (true at most once).
    mutating func reportTruncation() -> Bool {
        guard !peerFinished, !closedLocally, !reported else { return false }
        reported = true
        return true
    }

    /// Whether `error`, caught on an established circuit, is the peer's direction being cut: a reset stream
    /// (RST_STREAM from the relay or the peer, or the connection's loss, both of which swift-nio-http2 reports as
    /// `StreamClosed`).
    static func isCut(_ error: any Error) -> Bool {
        error is NIOHTTP2Errors.StreamClosed
    }
}
