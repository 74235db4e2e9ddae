import NIOConcurrencyHelpers

/// Requests sent one after another, each numbered, until cancelled: what a fail-closed test needs to say "no request
/// sent after the command returned got in". `fence()` read after the command returns is the first number sent after
/// it; `send` tells whether probe `n` was admitted (it carries `n` in its target, so the backend's log can be checked
/// too).
public final class NumberedProbes: Sendable {
    private struct State {
        var next = 0
        var admitted: [Int] = []
        var finished: [Int] = []
    }

    private let state = NIOLockedValueBox(State())
    private let send: @Sendable (Int) async -> Bool

    public init(send: @escaping @Sendable (Int) async -> Bool) {
        self.send = send
    }

    /// How many probes were admitted so far.
    public var admitted: Int { state.withLockedValue { $0.admitted.count } }
    /// The numbers of the admitted probes.
    public var admittedNumbers: [Int] { state.withLockedValue { $0.admitted } }
    /// The number the next probe will carry: every probe from it on is sent after this call.
    public func fence() -> Int { state.withLockedValue { $0.next } }
    /// How many probes numbered `fence` or later have an answer.
    public func finished(after fence: Int) -> Int {
        state.withLockedValue { $0.finished.filter { $0 >= fence }.count }
    }

    /// Sends probes until the task is cancelled.
    public func run() async {
        while !Task.isCancelled {
            let number = state.withLockedValue { state -> Int in
                defer { state.next += 1 }
                return state.next
            }
            let ok = await send(number)
            state.withLockedValue {
                if ok { $0.admitted.append(number) }
                $0.finished.append(number)
            }
        }
    }
}
