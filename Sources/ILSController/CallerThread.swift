import Dispatch
import NIOConcurrencyHelpers

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// Runs asynchronous work for a caller that cannot await: the fuzz targets, whose `EmbeddedChannel` only its own
/// thread may touch and whose inputs are synchronous. Never call it on an event loop or from a task.
package enum CallerThread {
    /// Runs `body` in a task and blocks this thread until the task has answered *and* has let go of everything it
    /// captured: when this returns, the answer and every value the work held belong to the caller alone.
    ///
    /// The second wait matters to LeakSanitizer. libFuzzer checks for leaks the moment an input returns; a task that
    /// has signalled but not yet torn down its closure context still holds the answer (a `Data` in an enum, whose
    /// pointer Swift stores with tag bits that LeakSanitizer cannot read), and its storage was reported as leaked
    /// (CI of stop 31: 125 bytes; here: a reissue answer's 818 bytes, never on replay).
    ///
    /// Called from a task it would hold one of the cooperative pool's few threads (two on a 2-core machine) for as
    /// long as the work takes, while that work needs a pool thread itself: the whole process then runs on what is
    /// left. A test that did so stalled every other task of the suite for up to 15 s under AddressSanitizer (CI of
    /// stop 34), so this refuses outright.
    package static func wait<Answer: Sendable>(_ body: @escaping @Sendable () async -> Answer) -> Answer {
        precondition(
            withUnsafeCurrentTask { $0 == nil },
            "CallerThread.wait blocks its thread: call it from a thread of its own, never from a task"
        )
        var job = Job(body)
        Task { [job] in await job.run() }
        job.answered.wait()
        // The task's closure context holds the other reference to `job`; it is released after `run()` returns. Once
        // the caller's is the only one, nothing of the work lives on another thread.
        while !isKnownUniquelyReferenced(&job) { sched_yield() }
        return job.take()
    }

    private final class Job<Answer: Sendable>: Sendable {
        let answered = DispatchSemaphore(value: 0)
        private let body: NIOLockedValueBox<(@Sendable () async -> Answer)?>
        private let answer = NIOLockedValueBox<Answer?>(nil)

        init(_ body: @escaping @Sendable () async -> Answer) { self.body = NIOLockedValueBox(body) }

        func run() async {
            // Taken out of the box, so the closure (and what it captured) ends with this call, not with the job.
            guard let body = self.body.withLockedValue({ $0.take() }) else { return }
            let value = await body()
            answer.withLockedValue { $0 = value }
            answered.signal()
        }

        func take() -> Answer {
            answer.withLockedValue { $0.take() }!
        }
    }
}
