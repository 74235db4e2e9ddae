package import NIOCore

/// What a circuit does when its path (the HTTP/2 stream under it) comes and goes: the decisions of a
/// `CircuitChannel`, as a value that takes events and returns actions, tested without a channel
/// (`CircuitPathMachineTests`, and `deploy/check-machine-mutations.py`).
///
/// A circuit is `handshaking` on its first path until the end-to-end handshake is done, then `attached`. With a
/// resumable suite (5) a path that is lost before the circuit ended both ways does not end it: it is `held` for the
/// grace window, its records kept, until a new path is attached (`resumed`) or the window runs out. With any other
/// suite, or before the handshake is done, a lost path ends the circuit as it always did: the end-to-end handler
/// above tells a cut from a clean end.
///
/// It also decides when a resumable circuit's path ends (END_STREAM). A direction's FINAL record does not end the
/// stream at once, as it does without resumption: the end that sent FINAL must still acknowledge what the other end
/// sends (a tunnel's client half-closes, then downloads). The path ends once both FINALs have crossed and ours is
/// acknowledged (`pathEndDue`): nothing a path loss could take is left, and every ACK the peer needs has gone
/// (each end acknowledges the peer's FINAL as soon as it opens it).
package struct CircuitPathMachine: Sendable {
    package enum State: Sendable, Equatable {
        case handshaking
        case attached
        /// No path; held until `deadline`.
        case held(deadline: NIODeadline)
        case closed
    }

    package private(set) var state = State.handshaking
    /// The handshake agreed a resumable suite.
    package private(set) var resumable = false
    /// Our direction has ended: the FINAL record went (or waits to go).
    package private(set) var outputEnded = false
    /// The peer has acknowledged our FINAL record.
    package private(set) var outputAcknowledged = false
    /// END_STREAM has gone on the current path.
    package private(set) var pathOutputEnded = false
    /// The peer's direction ended with its FINAL or CANCEL record.
    package private(set) var peerFinished = false
    /// The last resumption attempt accepted (the gateway) or made (the device).
    package private(set) var lastAttempt: UInt32 = 0
    package let grace: TimeAmount

    package init(grace: TimeAmount) {
        self.grace = grace
    }

    package enum PathLossAction: Sendable, Equatable {
        /// Keep the circuit with no path until the deadline (arm the grace timer; a device starts resuming).
        case hold(deadline: NIODeadline)
        /// The circuit ends with the path, as without resumption: pass the path's end up (the end-to-end handler
        /// tells a clean end from a cut).
        case end
        /// Nothing to do (the circuit is closed, or already held).
        case none
    }

    /// What the channel does after an event that may settle the circuit.
    package enum PathEndAction: Sendable, Equatable {
        /// END_STREAM goes on the current path now (it counts as gone from here).
        case endPath
        case none
    }

    /// What the channel does once the handshake is done.
    package enum EstablishedAction: Sendable, Equatable {
        /// Resumable: the path reads whatever the layer above asks, for the end-to-end handler must see the peer's
        /// ACKs (it holds the records the layer above has not asked for, `InboundRecords`).
        case readAlways
        /// The path reads only when the layer above asks, as any channel.
        case readOnDemand
    }

    /// The end-to-end handshake is done, with a resumable suite or not.
    package mutating func established(resumable: Bool) -> EstablishedAction {
        if state == .handshaking {
            state = .attached
            self.resumable = resumable
        }
        return self.resumable ? .readAlways : .readOnDemand
    }

    /// Our direction ended (the FINAL record went, or waits to go).
    package mutating func outputDidEnd() -> PathEndAction {
        outputEnded = true
        return pathEndAction()
    }

    /// The peer's direction ended with its FINAL or CANCEL record.
    package mutating func peerDidFinish() -> PathEndAction {
        peerFinished = true
        return pathEndAction()
    }

    /// The peer's ACK covers our FINAL record.
    package mutating func outputWasAcknowledged() -> PathEndAction {
        outputAcknowledged = true
        return pathEndAction()
    }

    /// `pathEndDue` as an action.
    package mutating func pathEndAction() -> PathEndAction { pathEndDue() ? .endPath : .none }

    /// Whether both directions have ended with their FINAL records: a close now is clean.
    package var isDone: Bool { outputEnded && peerFinished }

    /// Whether a path that goes now takes nothing with it: both directions ended, and (resumable) the peer has
    /// our FINAL. Until then a lost path is held, so a FINAL the path lost is sent again.
    package var isSettled: Bool { isDone && (outputAcknowledged || !resumable) }

    /// Whether END_STREAM should go on the current path now (then it counts as gone). Without resumption it follows
    /// our FINAL at once; with it, it waits for the circuit to be settled. The events above answer it; the channel
    /// asks it itself only once a new path has the records sent again (a resumption).
    package mutating func pathEndDue() -> Bool {
        guard outputEnded, !pathOutputEnded, state == .attached || state == .handshaking else { return false }
        guard !resumable || isSettled else { return false }
        pathOutputEnded = true
        return true
    }

    package enum CloseAction: Sendable, Equatable {
        /// Reset the path (RST_STREAM): the circuit is cut, or was never resumable.
        case reset
        /// End the path cleanly (END_STREAM unless it went already) and let it close by itself: both directions
        /// ended, and the peer may still need what is on its way (our FINAL, the ACK of its own).
        case end(sendEndStream: Bool)
    }

    /// The circuit closes (the layer above closed it) while it has a path.
    package mutating func closing() -> CloseAction {
        defer { state = .closed }
        guard resumable, state == .attached, isDone else { return .reset }
        let sendEndStream = !pathOutputEnded
        pathOutputEnded = true
        return .end(sendEndStream: sendEndStream)
    }

    /// The path is gone (reset, its connection dead, or closed by its far end).
    package mutating func pathLost(now: NIODeadline) -> PathLossAction {
        switch state {
        case .closed, .held:
            return .none
        case .handshaking:
            state = .closed
            return .end
        case .attached:
            guard resumable, grace > .zero, !isSettled else {
                state = .closed
                return .end
            }
            let deadline = now + grace
            state = .held(deadline: deadline)
            return .hold(deadline: deadline)
        }
    }

    package enum ResumeVerdict: Sendable, Equatable {
        /// Attach the new path (detaching the current one, if any, first).
        case attach
        case refuse(reason: String)
    }

    /// Whether a resume message for this circuit that arrived on a new path (the gateway; its tag is already
    /// checked) may be accepted. Changes nothing: a refused one leaves the circuit as it was.
    package func resumeVerdict(attempt: UInt32, now: NIODeadline) -> ResumeVerdict {
        switch state {
        case .handshaking, .closed:
            return .refuse(reason: "the circuit is not held")
        case .held(let deadline) where now > deadline:
            return .refuse(reason: "the circuit's grace window ran out")
        case .attached where !resumable:
            return .refuse(reason: "the circuit is not resumable")
        case .attached, .held:
            // A path the gateway still thinks alive can be the device's old one (a black-holed network keeps its
            // stream open at the relay until the keepalive notices): a newer attempt replaces it.
            return attempt > lastAttempt ? .attach : .refuse(reason: "the resumption was replayed")
        }
    }

    /// The resumption `resumeVerdict` allowed is done: the new path is attached, and no attempt up to this one
    /// will be accepted again.
    package mutating func resumeAccepted(attempt: UInt32, now: NIODeadline) -> Bool {
        guard resumeVerdict(attempt: attempt, now: now) == .attach else { return false }
        lastAttempt = attempt
        state = .attached
        pathOutputEnded = false
        return true
    }

    /// The device's next attempt number, if the circuit is held and may still resume.
    package mutating func nextAttempt(now: NIODeadline) -> UInt32? {
        guard case .held(let deadline) = state, now <= deadline else { return nil }
        lastAttempt += 1
        return lastAttempt
    }

    /// The device's resumption was answered: the new path is attached.
    package mutating func resumed() -> Bool {
        guard case .held = state else { return false }
        state = .attached
        pathOutputEnded = false
        return true
    }

    /// The grace timer fired: whether the circuit must now end (it is still held).
    package mutating func graceExpired(now: NIODeadline) -> Bool {
        guard case .held(let deadline) = state, now >= deadline else { return false }
        state = .closed
        return true
    }

    package mutating func closed() { state = .closed }
}
