import Foundation
import Logging
import NIOConcurrencyHelpers

/// The last lines every in-process role logged at `notice` and above, kept in memory so that a test that fails on a
/// loaded CI machine can print what the controller, gateways and tunnel said just before (a failure there is rare
/// and cannot be rerun with logging on). Lines carry the `cluster` metadata of the cluster that logged them.
public enum CapturedLog {
    static let capacity = 4000
    private static let lines = NIOLockedValueBox<[String]>([])

    /// The captured lines that mention `text` (e.g. `cluster=<id>`), oldest first.
    public static func lines(containing text: String) -> [String] {
        lines.withLockedValue { $0.filter { $0.contains(text) } }
    }

    static func append(_ line: String) {
        lines.withLockedValue { lines in
            if lines.count >= capacity { lines.removeFirst(capacity / 4) }
            lines.append(line)
        }
    }

    struct Handler: LogHandler {
        let label: String
        var metadata: Logger.Metadata = [:]
        var logLevel: Logger.Level = .notice

        subscript(metadataKey key: String) -> Logger.Metadata.Value? {
            get { metadata[key] }
            set { metadata[key] = newValue }
        }

        func log(event: LogEvent) {
            let all = metadata.merging(event.metadata ?? [:]) { $1 }
            let fields = all.sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value)" }.joined(separator: " ")
            let time = Date().formatted(.iso8601.time(includingFractionalSeconds: true))
            CapturedLog.append("\(time) \(event.level) \(fields) [\(event.source)] \(event.message)")
        }
    }
}
