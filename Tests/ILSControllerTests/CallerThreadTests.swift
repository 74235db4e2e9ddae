import Foundation
import Testing

@testable import ILSController

/// `CallerThread.wait` (the fuzz targets' way to run the asynchronous API) returns only once the task has let go of
/// everything its work captured, so LeakSanitizer, which checks the moment an input returns, finds nothing in flight.
@Suite struct CallerThreadTests {
    final class Witness: Sendable {}

    /// Runs `body` on a thread of its own, as libFuzzer calls the targets: `CallerThread.wait` blocks its thread, and
    /// on one of the cooperative pool's threads (a synchronous test's) it would starve every other test in the
    /// process while its own work waited for a pool thread too.
    static func onOwnThread<Value: Sendable>(_ body: @escaping @Sendable () -> Value) async -> Value {
        await withCheckedContinuation { (done: CheckedContinuation<Value, Never>) in
            Thread { done.resume(returning: body()) }.start()
        }
    }

    @Test func returnsTheAnswerAfterTheWorkLetGoOfWhatItCaptured() async {
        // Without the wait for the task's closure context, 4 runs of 4 here failed (at rounds 25 to 2,710).
        let failure: String? = await Self.onOwnThread {
            for round in 0..<3000 {
                weak var released: Witness?
                let answer: Int = {
                    let witness = Witness()
                    released = witness
                    return CallerThread.wait {
                        await Task.yield()
                        return withExtendedLifetime(witness) { round }
                    }
                }()
                if answer != round { return "round \(round): answered \(answer)" }
                if released != nil { return "round \(round): the work still held what it captured" }
            }
            return nil
        }
        #expect(failure == nil)
    }

    @Test func refusesToBlockATaskThread() async {
        await #expect(processExitsWith: .failure) {
            _ = CallerThread.wait { 1 }
        }
    }
}
