import Foundation
public import ILSCore
import ILSStore
public import Logging
public import ServiceLifecycle

/// Writes this controller's row in the store's controller list every `interval`, so the replicas sharing a
/// PostgreSQL store know each other (`GET /v1/controllers`): a replica that has not written for `window` seconds
/// (killed, partitioned from the store) drops off the list.
public struct ControllerHeartbeat: Service {
    /// Five seconds between heartbeats; a controller is listed while its last one is under 30 seconds old.
    public static let interval: Duration = .seconds(5)
    public static let window: Int64 = 30

    private let state: ControllerState
    private let logger: Logger
    private let startedAt = Int64(Date().timeIntervalSince1970)

    public init(state: ControllerState, logger: Logger) {
        self.state = state
        self.logger = logger
    }

    /// One heartbeat; errors are logged (the store may be down: the next beat retries).
    public func beat() async {
        let now = Int64(Date().timeIntervalSince1970)
        do throws(ILSError) {
            try await state.store.heartbeat(
                ControllerMember(address: state.address.description, startedAt: startedAt, lastSeenAt: now)
            )
        } catch {
            logger.warning("could not write the controller heartbeat", metadata: ["error": "\(error.reason)"])
        }
    }

    public func run() async throws {
        while !Task.isCancelled && !Task.isShuttingDownGracefully {
            await beat()
            try? await cancelWhenGracefulShutdown { try await Task.sleep(for: Self.interval) }
        }
    }
}
