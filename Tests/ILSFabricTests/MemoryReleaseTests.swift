import ILSFabric
import ILSTesting
import NIOConcurrencyHelpers
import Testing

/// `MemoryRelease`: a release only after circuits closed, at most one per interval. Each look at the count is an
/// interval gone by, so the test counts looks instead of sleeping.
@Suite("MemoryRelease: memory handed back only after circuits close")
struct MemoryReleaseTests {
    @Test("no release while no circuit closes, one after a close, none again until the next")
    func releasesOnlyAfterACloses() async throws {
        let state = NIOLockedValueBox((closed: 0, looks: 0, released: 0))
        let task = Task {
            await MemoryRelease.run(
                every: .milliseconds(5),
                closed: {
                    state.withLockedValue {
                        $0.looks += 1
                        return $0.closed
                    }
                },
                release: { state.withLockedValue { $0.released += 1 } }
            )
        }
        defer { task.cancel() }
        #expect(await TestCluster.eventually { state.withLockedValue { $0.looks } >= 6 })
        #expect(state.withLockedValue { $0.released } == 0, "released with nothing closed")
        state.withLockedValue { $0.closed += 1 }
        #expect(await TestCluster.eventually { state.withLockedValue { $0.released } == 1 })
        let looks = state.withLockedValue { $0.looks }
        #expect(await TestCluster.eventually { state.withLockedValue { $0.looks } >= looks + 5 })
        #expect(state.withLockedValue { $0.released } == 1, "released again with nothing more closed")
    }
}
