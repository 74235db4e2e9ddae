import ILSCore
public import ILSStore
import NIOConcurrencyHelpers

/// Audit rows written from an event loop (a refused bind or dial, refusal counts), in order, by one task, so the
/// loop never waits on the store. `flush()` waits until every row queued before it is written: the audit API calls
/// it before reading, so a page shows every refusal up to that moment.
///
/// Rows are best effort, like before: a row the store cannot write (a full disk, a store that is down) is dropped and
/// counted in the log by the caller's metrics, never retried forever. The queue holds at most `capacity` rows; beyond
/// that new rows are dropped (the refusal aggregator already keeps floods to one row per source and code a minute).
public final class AuditQueue: Sendable {
    enum Item: Sendable {
        case row(actor: String, action: String, target: String, detail: String)
        case barrier(CheckedContinuation<Void, Never>)
    }

    public static let capacity = 10_000

    private let continuation: AsyncStream<Item>.Continuation
    private let dropped = NIOLockedValueBox(0)

    init(store: any ControllerStore) {
        let (stream, continuation) = AsyncStream<Item>.makeStream(bufferingPolicy: .bufferingOldest(Self.capacity))
        self.continuation = continuation
        let dropped = self.dropped
        Task {
            for await item in stream {
                switch item {
                case .row(let actor, let action, let target, let detail):
                    do throws(ILSError) {
                        try await store.audit(actor: actor, action: action, target: target, detail: detail)
                    } catch {
                        dropped.withLockedValue { $0 += 1 }
                    }
                case .barrier(let waiter):
                    waiter.resume()
                }
            }
        }
    }

    func append(actor: String, action: String, target: String, detail: String) {
        if case .dropped = continuation.yield(.row(actor: actor, action: action, target: target, detail: detail)) {
            dropped.withLockedValue { $0 += 1 }
        }
    }

    /// Returns once every row appended before the call is written (or dropped).
    func flush() async {
        await withCheckedContinuation { waiter in
            switch continuation.yield(.barrier(waiter)) {
            case .enqueued: break
            // A full queue drops the newest item, this barrier: return rather than wait for a row never written.
            case .dropped, .terminated: waiter.resume()
            @unknown default: waiter.resume()
            }
        }
    }

    /// The writer task holds the stream and the store, not the queue: when the last copy of the controller's state
    /// lets the queue go, its rows are written and the task ends, releasing the store (before, the task waited on
    /// the stream for ever and kept every store it was given alive: LeakSanitizer's SQLite connection at exit).
    deinit {
        continuation.finish()
    }

    /// Rows lost so far (queue full or store failing).
    public var droppedRows: Int { dropped.withLockedValue { $0 } }

    /// Ends the writer after the rows already queued.
    func finish() {
        continuation.finish()
    }
}
