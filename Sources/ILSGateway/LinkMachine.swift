import ILSFabric
import NIOCore

/// One link of a gateway to a controller, as a struct that takes events and returns what to do: the overlay's links
/// (`OverlayGateway`, one machine per slot) and HTTP mode's policy link (`PolicyLink`) alike. Tested without a channel
/// (`LinkMachineTests`), as `ProxyConnectionMachine` is.
///
/// A link is dialled, connected, then answered by the controller: bound (on one of its relay loops) or refused. When
/// it ends, how it ended decides how long to wait before the next dial (`LinkBackoff`). A renewal rotates it: the link
/// in use drains (overlay) or closes (policy link) and a new one is dialled at once with the new certificate.
///
/// Why a machine: these facts lived in optionals and parallel dictionaries that each path updated in its own order,
/// and once a bound link was forgotten (the controller's answer arrived before the dial's own bookkeeping, which then
/// reset it), so certificate checks went unasked and a deleted device got in on the local decision. Here an answer is
/// tied to its connection, and one that arrives before the dial has returned is kept (`dialling`).
struct LinkMachine: Sendable {
    typealias Connection = ObjectIdentifier

    enum State: Equatable, Sendable {
        /// Not connected: before the first dial, and between tries.
        case idle
        /// A connection is being made with `certificate`; `stale` once a renewal replaced that certificate meanwhile.
        case dialling(certificate: String, stale: Bool)
        case linked(Link)
        case stopped
    }

    struct Link: Equatable, Sendable {
        let connection: Connection
        /// The certificate it was dialled with.
        let certificate: String
        var binding: Binding
    }

    /// The controller's answer to a link's binding.
    enum Binding: Equatable, Sendable {
        case awaiting
        /// Accepted, on relay loop `relayLoop` of the controller's (nil: the controller does not say).
        case bound(relayLoop: Int?)
        case refused(reason: String, code: String?)
        /// Accepted on a relay loop another link to the same controller has (overlay): closed, to be dialled again.
        case duplicate
    }

    /// What to do with a connection just made.
    enum Connected: Equatable, Sendable {
        case keep
        /// The gateway stopped meanwhile.
        case close
        /// It was dialled with a certificate a renewal replaced meanwhile: drain it and dial again at once.
        case replace
    }

    /// What the controller's acceptance of a binding means.
    enum Acceptance: Equatable, Sendable {
        case bound
        /// Close the connection: another link to the controller has its relay loop.
        case duplicate
        /// Not this link's connection (or no longer): nothing to do.
        case stale
    }

    /// What to do once a link has ended (or its dial failed).
    enum Next: Equatable, Sendable {
        case dial(after: TimeAmount, because: Ending)
        case stop
    }

    enum Ending: Equatable, Sendable {
        /// A renewal replaced it (it drains or closes on its own): dial at once with the new certificate.
        case rotated
        case refused(code: String?)
        /// It landed on a taken relay loop; `quick` while the retries at once last.
        case duplicate(quick: Bool)
        /// It closed: bound before, or before the controller answered.
        case lost(wasBound: Bool)
        /// The dial failed.
        case failed
    }

    private(set) var state: State = .idle
    private var backoff = LinkBackoff()
    /// Links that landed on a taken relay loop: slower than `backoff`, since the controller is up and the link only
    /// redundant, and not reset by each connection.
    private var duplicateBackoff = Backoff(maximum: .seconds(3))
    /// Consecutive times this link landed on a relay loop another link to its controller already had.
    private var duplicates = 0

    /// A link that lands on a loop another link has is dropped and dialled again: at once up to this many times in a
    /// row per relay loop (connections land on the loops in turn, other peers' interleaved), then with backoff.
    static let quickRetriesPerLoop = 4
    /// The wait before a quick redial: long enough for other peers' connections to move the controller's turn on.
    static let quickRedial: ClosedRange<Int64> = 10...50

    var isStopped: Bool { state == .stopped }

    /// The link connected now, whatever its binding.
    var link: Link? {
        guard case .linked(let link) = state else { return nil }
        return link
    }

    /// The link bound now: its connection, its certificate, and the controller's relay loop it is on (0 when the
    /// controller does not say).
    var bound: (connection: Connection, certificate: String, relayLoop: Int)? {
        guard let link, case .bound(let loop) = link.binding else { return nil }
        return (link.connection, link.certificate, loop ?? 0)
    }

    /// Whether something that `connection` brings (an answer, a control stream) is this link's: its connection's, or
    /// any connection's while the dial has not returned yet (the controller may answer first, on the link's loop).
    func accepts(_ connection: Connection) -> Bool {
        switch state {
        case .dialling(_, let stale): return !stale
        case .linked(let link): return link.connection == connection
        case .idle, .stopped: return false
        }
    }

    /// The connect loop is about to dial with `certificate`; false once stopped.
    mutating func dial(certificate: String) -> Bool {
        guard state != .stopped else { return false }
        state = .dialling(certificate: certificate, stale: false)
        return true
    }

    /// The dial made `connection`.
    mutating func connected(_ connection: Connection) -> Connected {
        switch state {
        case .stopped:
            return .close
        case .dialling(let certificate, stale: false):
            state = .linked(Link(connection: connection, certificate: certificate, binding: .awaiting))
        case .dialling(_, stale: true):
            state = .idle
            return .replace
        case .linked(let link) where link.connection == connection:
            break  // the controller's answer came first
        case .linked(let link):
            // An answer taken for this dial's came on another connection: this one's is still to come.
            state = .linked(Link(connection: connection, certificate: link.certificate, binding: .awaiting))
        case .idle:
            // Only a rotation or a stop moves a dialling link to idle; a rotation while dialling marks it stale.
            state = .idle
            return .replace
        }
        return .keep
    }

    /// The dial failed: the wait before the next.
    mutating func dialFailed() -> Next {
        guard state != .stopped else { return .stop }
        state = .idle
        return .dial(after: backoff.failed(), because: .failed)
    }

    /// The controller accepted `connection`'s binding, on `relayLoop` of its `relayLoops` (when it says), which
    /// another link to it already has if `loopTaken`. A policy message that repeats the acceptance changes nothing.
    mutating func accepted(
        _ connection: Connection,
        relayLoop: Int? = nil,
        loopTaken: Bool = false,
        relayLoops: Int? = nil
    ) -> Acceptance {
        guard accepts(connection) else { return .stale }
        let certificate: String
        switch state {
        case .dialling(let dialled, _):
            certificate = dialled
        case .linked(let link):
            if case .bound = link.binding { return .bound }
            guard link.binding == .awaiting else { return .stale }
            certificate = link.certificate
        case .idle, .stopped:
            return .stale
        }
        self.relayLoops = relayLoops
        if loopTaken {
            duplicates += 1
            state = .linked(Link(connection: connection, certificate: certificate, binding: .duplicate))
            return .duplicate
        }
        duplicates = 0
        state = .linked(Link(connection: connection, certificate: certificate, binding: .bound(relayLoop: relayLoop)))
        return .bound
    }

    /// How many relay loops the controller said it has, at the last binding (for the quick retries' count).
    private var relayLoops: Int?

    /// The controller refused `connection`'s binding; false if that is not this link's connection.
    mutating func refused(_ connection: Connection, reason: String, code: String?) -> Bool {
        guard accepts(connection) else { return false }
        let certificate: String
        switch state {
        case .dialling(let dialled, _): certificate = dialled
        case .linked(let link): certificate = link.certificate
        case .idle, .stopped: return false
        }
        state = .linked(
            Link(connection: connection, certificate: certificate, binding: .refused(reason: reason, code: code))
        )
        return true
    }

    /// A renewal: the link in use (returned) is replaced, and the next dial starts at once; a dial in progress is
    /// replaced once it connects.
    mutating func rotate() -> Connection? {
        switch state {
        case .linked(let link):
            state = .idle
            return link.connection
        case .dialling(let certificate, _):
            state = .dialling(certificate: certificate, stale: true)
            return nil
        case .idle, .stopped:
            return nil
        }
    }

    /// The connect loop's link `connection` closed, or was rotated away: what to do now.
    mutating func ended(_ connection: Connection) -> Next {
        if state == .stopped { return .stop }
        guard case .linked(let link) = state, link.connection == connection else {
            // Not the link in use any more: a renewal replaced it, and it drains or closes on its own.
            return .dial(after: .zero, because: .rotated)
        }
        state = .idle
        switch link.binding {
        case .refused(_, let code):
            return .dial(after: backoff.refused(code: code), because: .refused(code: code))
        case .duplicate:
            backoff.bound()
            let quick = duplicates <= Self.quickRetriesPerLoop * max(relayLoops ?? 1, 2)
            let wait: TimeAmount = quick ? .milliseconds(.random(in: Self.quickRedial)) : duplicateBackoff.next()
            return .dial(after: wait, because: .duplicate(quick: quick))
        case .bound:
            backoff.bound()
            duplicateBackoff.reset()
            return .dial(after: backoff.failed(), because: .lost(wasBound: true))
        case .awaiting:
            duplicateBackoff.reset()
            return .dial(after: backoff.failed(), because: .lost(wasBound: false))
        }
    }

    /// Stops the link for good: the connection to close, if one is up.
    mutating func stop() -> Connection? {
        defer { state = .stopped }
        return link?.connection
    }
}
