/// What an app's link to the overlay is doing, for its UI (`OverlayDialer.linkStates`).
///
/// Only what the library has seen: `ready` means the controller connection is up and answered recently, not that a
/// given answer will come; `stalled` is said as soon as a circuit waits on a connection that has been silent past
/// the keepalive interval (a PING is out, unanswered), so a UI never shows "connected" over a dead link for longer
/// than that.
public enum LinkState: Sendable, Hashable, CustomStringConvertible {
    /// No controller connection and nothing asked for: the state after the idle close, and before the first request.
    case idle
    /// A controller connection is being made.
    case connecting
    /// The controller connection is up.
    case ready
    /// A circuit is open and its connection has received nothing for the keepalive interval: a PING is out. Back to
    /// `ready` when anything arrives; the connection is closed (then `resuming` or `idle`) when the PING's timeout
    /// runs out.
    case stalled
    /// A circuit's path was lost and the library is resuming it (within its grace window).
    case resuming
    /// The last attempt to reach the overlay failed, for `reason` (`code`: `controller_unreachable`, or the
    /// controller's refusal, e.g. `identity_blocked`: the identity was revoked, disabled or replaced, and only a new
    /// enrollment helps). The next request tries again.
    case offline(code: String, reason: String)

    public var description: String {
        switch self {
        case .idle: "idle"
        case .connecting: "connecting"
        case .ready: "ready"
        case .stalled: "stalled"
        case .resuming: "resuming"
        case .offline(let code, let reason): "offline (\(code)): \(reason)"
        }
    }
}

/// The dialer's link state as a struct of events (tested without a network, as the fabric's machines are).
struct LinkStateMachine: Sendable, Equatable {
    private(set) var state = LinkState.idle
    /// Whether a controller connection is up.
    private var isConnected = false
    /// Circuits whose path is lost, being resumed.
    private var held = 0
    /// Whether the connection's keepalive has a PING out unanswered while circuits are open.
    private var silent = false

    /// Each event returns the new state if it changed, nil otherwise.
    mutating func connecting() -> LinkState? {
        settle(isConnected || held > 0 ? state : .connecting)
    }

    mutating func connected() -> LinkState? {
        isConnected = true
        silent = false
        return settle(derived)
    }

    mutating func connectFailed(code: String, reason: String) -> LinkState? {
        isConnected = false
        silent = false
        return settle(held > 0 ? .resuming : .offline(code: code, reason: reason))
    }

    /// A circuit was refused for the identity itself: the link is as good as down, whatever the connection.
    mutating func identityRefused(code: String, reason: String) -> LinkState? {
        settle(.offline(code: code, reason: reason))
    }

    mutating func connectionClosed() -> LinkState? {
        isConnected = false
        silent = false
        return settle(derived)
    }

    mutating func keepalive(silent: Bool) -> LinkState? {
        self.silent = silent
        return settle(derived)
    }

    mutating func circuitHeld() -> LinkState? {
        held += 1
        return settle(derived)
    }

    /// A held circuit was resumed, or given up.
    mutating func circuitSettled() -> LinkState? {
        held = max(held - 1, 0)
        return settle(derived)
    }

    private var derived: LinkState {
        if held > 0 { return .resuming }
        guard isConnected else {
            if case .offline = state { return state }
            return .idle
        }
        return silent ? .stalled : .ready
    }

    private mutating func settle(_ next: LinkState) -> LinkState? {
        guard next != state else { return nil }
        state = next
        return next
    }
}
