import ILSFabric
import NIOCore
import Testing

@Suite("Reconnect backoff")
struct BackoffTests {
    @Test("doubles from 100 ms, jittered within [step/2, step], and never waits longer than 800 ms")
    func reconnectSteps() {
        for _ in 0..<50 {
            var backoff = Backoff()
            let waits = (0..<12).map { _ in backoff.next().nanoseconds }
            let steps: [Int64] = [100, 200, 400, 800, 800, 800, 800, 800, 800, 800, 800, 800].map { $0 * 1_000_000 }
            for (wait, step) in zip(waits, steps) {
                #expect(wait >= step / 2 && wait <= step, "wait \(wait) ns outside [\(step / 2), \(step)]")
            }
        }
    }

    @Test("the wait after a controller comes back stays under a second, however long it was away")
    func boundedRecovery() {
        var backoff = Backoff()
        let longest = (0..<1000).map { _ in backoff.next() }.max()!
        #expect(longest <= .milliseconds(800))
        #expect(longest < .seconds(1))
    }

    @Test("reset starts again at 100 ms; another cap can be given")
    func resetAndCap() {
        var backoff = Backoff(maximum: .seconds(3))
        for _ in 0..<10 { _ = backoff.next() }
        #expect(backoff.next() >= .milliseconds(1500))
        backoff.reset()
        #expect(backoff.next() <= .milliseconds(100))
    }
}
