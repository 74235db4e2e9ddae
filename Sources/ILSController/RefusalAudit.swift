import ILSCore
import NIOConcurrencyHelpers

/// The controller's `RefusalAggregator`, shared by every connection, writing the rows it asks for.
///
/// A refusal's row is best effort (`AuditQueue`): an audit row that cannot be written (a full disk) must not turn a
/// refusal into a different error, and the count it stood for is lost, not retried.
public final class RefusalAudit: Sendable {
    private let aggregator: NIOLockedValueBox<RefusalAggregator>

    init(aggregator: RefusalAggregator = RefusalAggregator()) {
        self.aggregator = NIOLockedValueBox(aggregator)
    }

    /// Returns whether this refusal was the first of its source and code in the window (the caller logs only
    /// those: a log line per refusal would be the same amplification, in the journal).
    @discardableResult
    func record(source: String, code: String, now: Int64, action: String, queue: AuditQueue) -> Bool {
        let rows = aggregator.withLockedValue { $0.record(source: source, code: code, now: now) }
        write(rows, action: action, queue: queue)
        return rows.contains { $0.detail == code }
    }

    /// Writes the counts not yet written: before the audit log is read, and now and then in the background.
    func drain(action: String, queue: AuditQueue) {
        write(aggregator.withLockedValue { $0.drain() }, action: action, queue: queue)
    }

    private func write(_ rows: [RefusalAggregator.Row], action: String, queue: AuditQueue) {
        for row in rows { queue.append(actor: row.actor, action: action, target: "-", detail: row.detail) }
    }
}
