import NIOConcurrencyHelpers

/// The last event of `TestBackend`'s `/sse-held` stream, held until the test releases it: a test can then check
/// that the earlier events reached the client while the backend had not yet emitted the last one, by ordering
/// rather than by timing.
public final class HeldEvent: Sendable {
    private struct State {
        var released = false
        var waiters: [@Sendable () -> Void] = []
    }
    private let state = NIOLockedValueBox(State())

    init() {}

    /// Lets every held (and every future) `/sse-held` stream send its last event, and `/bytes?held` body go.
    public func release() {
        let waiters = state.withLockedValue { state in
            state.released = true
            defer { state.waiters = [] }
            return state.waiters
        }
        for waiter in waiters { waiter() }
    }

    /// Runs `action` once released (at once if already).
    func whenReleased(_ action: @escaping @Sendable () -> Void) {
        let now = state.withLockedValue { state in
            if !state.released { state.waiters.append(action) }
            return state.released
        }
        if now { action() }
    }
}
