import Foundation
public import Testing

/// Runs the tests of a suite that starts whole systems (a controller, gateways, backends, PostgreSQL servers) a few at
/// a time across the whole test process, whatever suite or module they are in, while unit tests keep running beside
/// them.
///
/// Swift Testing's `.serialized` orders only one suite's own tests; ~470 tests in parallel on 2 cores once held a
/// dozen clusters at a time, each with its event loops, TLS handshakes and deadlines, and the deadlines ran out
/// (issue 36). With this trait a cluster test waits for a slot before it starts, so its own deadlines only count time
/// in which it runs beside at most `width - 1` others. The wait for a slot is outside the test's body: the body's
/// deadlines do not see it.
///
/// `ILS_TEST_CLUSTERS` sets the width (default 2: one cluster per core).
public struct ClusterExclusiveTrait: TestTrait, SuiteTrait, TestScoping {
    /// How many slots a test takes: one, or every slot (`clusterAlone`).
    let alone: Bool

    public var isRecursive: Bool { true }

    public func provideScope(
        for test: Test,
        testCase: Test.Case?,
        performing function: @Sendable () async throws -> Void
    ) async throws {
        // A test of a `clusterExclusive` suite that is itself `clusterAlone` (a heavy test among light ones) gets both
        // traits: the suite's, inherited, takes nothing, and the test's own takes every slot. Taking one slot and then
        // the rest could deadlock two such tests, each holding one.
        if !alone, test.traits.contains(where: { ($0 as? ClusterExclusiveTrait)?.alone == true }) {
            try await function()
            return
        }
        let slots = alone ? ClusterSlots.configuredWidth : 1
        await ClusterSlots.shared.acquire(slots)
        do {
            try await function()
        } catch {
            await ClusterSlots.shared.release(slots)
            throw error
        }
        await ClusterSlots.shared.release(slots)
    }
}

extension Trait where Self == ClusterExclusiveTrait {
    /// This suite's tests start whole systems: at most `ILS_TEST_CLUSTERS` (default 2) such tests run at once in the
    /// process (`ClusterExclusiveTrait`).
    public static var clusterExclusive: Self { ClusterExclusiveTrait(alone: false) }

    /// This suite's tests, or this test, load the machine on purpose (floods of circuits or resets, hundreds of held
    /// circuits, transfers of many MiB): each runs with no other cluster test beside it, whose deadlines it would
    /// otherwise eat (stop 46's local CI: two tests of services and policies beside the flood of 3,000 resets waited
    /// more than 10 s for their controller). On a test of a `clusterExclusive` suite it takes the place of the
    /// suite's trait. docs/testing.md lists the tests that carry it.
    public static var clusterAlone: Self { ClusterExclusiveTrait(alone: true) }
}

/// A counting semaphore for tasks, first come first served.
actor ClusterSlots {
    static let shared = ClusterSlots(width: ClusterSlots.configuredWidth)

    static var configuredWidth: Int {
        guard let raw = ProcessInfo.processInfo.environment["ILS_TEST_CLUSTERS"], let width = Int(raw),
            (1...64).contains(width)
        else { return 2 }
        return width
    }

    private var free: Int
    private var waiting: [(slots: Int, continuation: CheckedContinuation<Void, Never>)] = []

    init(width: Int) {
        self.free = width
    }

    /// Takes `slots` (at most the width) once they are free and nobody waits before.
    func acquire(_ slots: Int) async {
        if waiting.isEmpty, free >= slots {
            free -= slots
            return
        }
        await withCheckedContinuation { waiting.append((slots, $0)) }
    }

    /// Hands the slots to the waiters in order of arrival, as far as they go: a test that waits for every slot is
    /// not overtaken by later arrivals that need one, so it cannot be starved.
    func release(_ slots: Int) {
        free += slots
        while let first = waiting.first, free >= first.slots {
            waiting.removeFirst()
            free -= first.slots
            first.continuation.resume()
        }
    }
}
