import Foundation
public import ILSCore
public import Logging
import NIOPosix
public import ServiceLifecycle

/// Audit retention and the other store work that must stay off the request path, every `interval`.
///
/// Each pass, on NIO's blocking-I/O thread pool (a pass can take a moment on a large log, and no event loop may
/// wait for it): the refusal counts not yet written (`RefusalAudit`), the blocks a full disk kept from being saved
/// (`UnsavedBlocks`), then pruning: entries older than `retention.maximumAge` and beyond the newest
/// `retention.maximumRows`, in batches of 1,000 rows per transaction.
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

    public init(state: ControllerState, retention: Retention, interval: TimeSpan = defaultInterval, logger: Logger) {
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
        // The counts of the last minutes go in before the controller stops.
        controller.flushRefusals()
    }

    /// One pass; returns the number of audit rows pruned. Errors are logged, never thrown: the next pass retries.
    @discardableResult
    public func pass(now: Int64? = nil) async -> Int {
        let now = now ?? Int64(Date().timeIntervalSince1970)
        let controller = self.controller
        let retention = self.retention
        let outcome = try? await NIOThreadPool.singleton.runIfActive { () -> Result<(Int, Int), ILSError> in
            controller.flushRefusals()
            let unsaved = controller.saveUnsavedBlocks()
            do throws(ILSError) {
                let pruned = try controller.state.store.pruneAudit(
                    olderThan: now - retention.maximumAge.nanoseconds / 1_000_000_000,
                    keepingAtMost: retention.maximumRows,
                    batch: 1000
                )
                return .success((pruned, unsaved))
            } catch {
                return .failure(error)
            }
        }
        switch outcome {
        case .success((let pruned, let unsaved)):
            if pruned > 0 { logger.info("audit log pruned", metadata: ["rows": "\(pruned)"]) }
            if unsaved > 0 { logger.error("blocks still unsaved in the store", metadata: ["count": "\(unsaved)"]) }
            return pruned
        case .failure(let error):
            logger.warning("audit retention failed", metadata: ["error": "\(error.detail ?? error.reason)"])
            return 0
        case nil:
            return 0
        }
    }
}
