import ILSCore
import ILSStore
import Logging
import NIOConcurrencyHelpers
import PostgresNIO

/// How the change feed proves it still hears: every `interval`, a `ping:NONCE` notification goes out through another
/// connection of the pool, and must come back on the listening connection within `bound`.
public struct ChangeFeedProbe: Sendable {
    public var interval: Duration
    public var bound: Duration

    public init(interval: Duration, bound: Duration) {
        self.interval = interval
        self.bound = bound
    }

    /// A silent feed is noticed within 25 seconds; each controller sends four tiny notifications a minute.
    public static let standard = ChangeFeedProbe(interval: .seconds(15), bound: .seconds(10))
}

/// The listening side of `PostgresDialect.changes()`: one LISTEN connection at a time, and a probe that replaces
/// it when it stops hearing.
///
/// A LISTEN connection can die without a word: a NAT or firewall that forgets the flow, a server backend that hangs,
/// a lease or LISTEN that never completes after a restart (the store suite's restart test once waited 3 minutes for a
/// feed that never listened again). Only the end-to-end question is sure: does a notification sent now come back? A
/// probe that is not heard while the store answered closes that connection (so the pool never hands it out again),
/// abandons its task, and listens on a new one, which yields `.resynchronize` as after any loss. A probe that cannot
/// be sent (the store is down) proves nothing either way: the feed waits for the next.
struct PostgresChangeFeed: Sendable {
    static let pingPrefix = "ping:"

    let client: PostgresClient
    let logger: Logger
    let description: String
    let probe: ChangeFeedProbe
    /// Sends a notification on the feed's channel through a pooled connection, bounded like every store call.
    let ping: @Sendable (String) async throws(ILSError) -> Void

    /// What one listening attempt shares with the probe.
    private struct Attempt: Sendable {
        var connection: PostgresConnection?
        var ended = false
        /// Set by the probe before it pings; the listener answers when it hears exactly this payload.
        var awaited: String?
        var heard = false
        /// An abandoned attempt that wakes up later yields nothing more.
        var abandoned = false
    }

    private enum Verdict {
        case ended
        case deaf
        case cancelled
    }

    func run(into continuation: AsyncStream<StoreChange>.Continuation) async {
        var first = true
        while !Task.isCancelled {
            let attempt = NIOLockedValueBox(Attempt())
            let announce = !first  // every listen after the first may have missed commits
            first = false
            let listener = Task { await listen(attempt, announce: announce, into: continuation) }
            let verdict = await watch(attempt)
            let connection = attempt.withLockedValue { attempt in
                attempt.abandoned = true
                return attempt.connection
            }
            listener.cancel()
            if verdict == .deaf {
                logger.warning(
                    "the store's change feed stopped hearing while the store answered; listening on a new connection",
                    metadata: ["store": "\(description)"]
                )
                // Closed, not only left: a connection that went deaf must not go back to the pool.
                try? await connection?.close()
            }
            if verdict == .cancelled { break }
            try? await Task.sleep(for: .milliseconds(500))
        }
        continuation.finish()
    }

    private func listen(
        _ attempt: NIOLockedValueBox<Attempt>,
        announce: Bool,
        into continuation: AsyncStream<StoreChange>.Continuation
    ) async {
        do {
            try await client.withConnection { connection in
                attempt.withLockedValue { $0.connection = connection }
                try await connection.listen(on: PostgresDialect.channel) { notifications in
                    if announce, !attempt.withLockedValue({ $0.abandoned }) { continuation.yield(.resynchronize) }
                    for try await notification in notifications {
                        let payload = notification.payload
                        let abandoned = attempt.withLockedValue { attempt in
                            if payload == attempt.awaited { attempt.heard = true }
                            return attempt.abandoned
                        }
                        if abandoned { return }
                        if let change = StoreChange(payload: payload) { continuation.yield(change) }
                    }
                }
            }
        } catch {
            if !Task.isCancelled, !attempt.withLockedValue({ $0.abandoned }) {
                logger.warning(
                    "lost the store's change notifications; listening again",
                    metadata: ["store": "\(description)"]
                )
            }
        }
        attempt.withLockedValue { $0.ended = true }
    }

    /// Waits until the attempt ends, the probe finds it deaf, or the feed is cancelled. It looks at the attempt every
    /// 100 ms rather than awaiting the listener's task: a task stuck in a lease or a LISTEN that never answers is
    /// exactly what this must not wait on.
    private func watch(_ attempt: NIOLockedValueBox<Attempt>) async -> Verdict {
        let clock = ContinuousClock()
        while true {
            let probeAt = clock.now + probe.interval
            while clock.now < probeAt {
                if attempt.withLockedValue({ $0.ended }) { return .ended }
                do { try await Task.sleep(for: .milliseconds(100)) } catch { return .cancelled }
            }
            let nonce = Self.pingPrefix + String(UInt64.random(in: .min ... .max), radix: 16)
            attempt.withLockedValue { attempt in
                attempt.awaited = nonce
                attempt.heard = false
            }
            do throws(ILSError) {
                try await ping(nonce)
            } catch {
                continue  // the store did not take the probe: no verdict
            }
            let heardBy = clock.now + probe.bound
            while !attempt.withLockedValue({ $0.heard }) {
                if attempt.withLockedValue({ $0.ended }) { return .ended }
                if clock.now >= heardBy { return .deaf }
                do { try await Task.sleep(for: .milliseconds(50)) } catch { return .cancelled }
            }
        }
    }
}
