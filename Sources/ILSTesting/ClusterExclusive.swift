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
    public var isRecursive: Bool { true }

    public func provideScope(
        for test: Test,
        testCase: Test.Case?,
        performing function: @Sendable () async throws -> Void
    ) async throws {
        await ClusterSlots.shared.acquire()
        do {
            try await function()
        } catch {
            await ClusterSlots.shared.release()
            throw error
        }
        await ClusterSlots.shared.release()
    }
}

extension Trait where Self == ClusterExclusiveTrait {
    /// This suite's tests start whole systems: at most `ILS_TEST_CLUSTERS` (default 2) such tests run at once in the
    /// process (`ClusterExclusiveTrait`).
    public static var clusterExclusive: Self { ClusterExclusiveTrait() }
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
    private var waiting: [CheckedContinuation<Void, Never>] = []

    init(width: Int) {
        self.free = width
    }

    func acquire() async {
        if free > 0 {
            free -= 1
            return
        }
        await withCheckedContinuation { waiting.append($0) }
    }

    /// Hands the slot straight to the longest waiter, so a steady stream of new arrivals cannot starve it.
    func release() {
        if waiting.isEmpty {
            free += 1
        } else {
            waiting.removeFirst().resume()
        }
    }
}
