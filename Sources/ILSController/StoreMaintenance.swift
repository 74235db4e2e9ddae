import Foundation
public import ILSCore
public import Logging
public import ServiceLifecycle

/// Audit retention and the other store work that must stay off the request path, every `interval`.
///
/// Each pass (the store runs its calls off the event loops): the refusal counts not yet written (`RefusalAudit`),
/// the blocks a full disk kept from being saved (`UnsavedBlocks`), the last-seen times authentication noted in
/// memory, a full reload of the identity directory (the backstop for a missed change notification), then pruning:
/// entries older than `retention.maximumAge` and beyond the newest `retention.maximumRows`, in batches of 1,000
/// rows per transaction.
public struct StoreMaintenance: Service {
    /// How long and how much of the audit log to keep.
    public struct Retention: Sendable, Equatable {
        public var maximumAge: TimeSpan
        public var maximumRows: Int

        public init(maximumAge: TimeSpan, maximumRows: Int) {
            self.maximumAge = maximumAge
            self.maximumRows = maximumRows
        }

        /// 90 days (a quarter's investigations) and one million rows (about 150 MB of store at the longest rows, far
        /// less in practice); whichever is reached first.
        public static let standard = Retention(maximumAge: .seconds(90 * 86_400), maximumRows: 1_000_000)
    }

    /// A minute: a block the store could not save is retried this often, and a refusal count waits at most this long.
    public static let defaultInterval: TimeSpan = .seconds(60)

    private let controller: Controller
    private let retention: Retention
    private let interval: TimeSpan
    private let logger: Logger

    /// Set by `ControllerServer.maintenance(...)`: enforces the policies again when a reload changed them.
    private let policies: PolicyEnforcement?

    public init(state: ControllerState, retention: Retention, interval: TimeSpan = defaultInterval, logger: Logger) {
        self.init(state: state, retention: retention, interval: interval, policies: nil, logger: logger)
    }

    init(
        state: ControllerState,
        retention: Retention,
        interval: TimeSpan,
        policies: PolicyEnforcement?,
        logger: Logger
    ) {
        self.policies = policies
        self.controller = Controller(state: state)
        self.retention = retention
        self.interval = interval
        self.logger = logger
    }

    public func run() async throws {
        while !Task.isCancelled && !Task.isShuttingDownGracefully {
            await pass()
            let wait = Duration.nanoseconds(interval.nanoseconds)
            try? await cancelWhenGracefulShutdown { try await Task.sleep(for: wait) }
        }
        // The counts and times of the last minutes go in before the controller stops.
        await controller.flushRefusals()
        try? await controller.state.store.recordLastSeen(controller.state.identities.takeLastSeen())
    }

    /// One pass; returns the number of audit rows pruned. Errors are logged, never thrown: the next pass retries.
    @discardableResult
    public func pass(now: Int64? = nil) async -> Int {
        let now = now ?? Int64(Date().timeIntervalSince1970)
        let state = controller.state
        await controller.flushRefusals()
        let unsaved = await controller.saveUnsavedBlocks()
        let seen = state.identities.takeLastSeen()
        do throws(ILSError) {
            try await state.store.recordLastSeen(seen)
        } catch {
            state.identities.restoreLastSeen(seen)
            logger.warning("could not record last-seen times", metadata: ["error": "\(error.detail ?? error.reason)"])
        }
        // The backstop for a change notification this controller missed: the directory is read whole again.
        let inputs = PolicyEnforcement.Inputs(state.identities)
        do throws(ILSError) {
            try await state.identities.reload(from: state.store)
            // A narrowing the feed missed cuts here, as it would have when heard.
            policies?.reloaded(before: inputs)
        } catch {
            logger.warning("could not reload identities", metadata: ["error": "\(error.detail ?? error.reason)"])
        }
        let outcome: Result<(Int, Int), ILSError>
        do throws(ILSError) {
            let pruned = try await state.store.pruneAudit(
                olderThan: now - retention.maximumAge.nanoseconds / 1_000_000_000,
                keepingAtMost: retention.maximumRows,
                batch: 1000
            )
            outcome = .success((pruned, unsaved))
        } catch {
            outcome = .failure(error)
        }
        switch outcome {
        case .success((let pruned, let unsaved)):
            if pruned > 0 { logger.info("audit log pruned", metadata: ["rows": "\(pruned)"]) }
            if unsaved > 0 { logger.error("blocks still unsaved in the store", metadata: ["count": "\(unsaved)"]) }
            return pruned
        case .failure(let error):
            logger.warning("audit retention failed", metadata: ["error": "\(error.detail ?? error.reason)"])
            return 0
        }
    }
}
