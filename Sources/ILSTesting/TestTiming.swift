import Foundation
public import ILSCore
public import NIOCore

/// Stretches the deadlines tests set on purpose (idle and header timeouts, stream intervals, handshake deadlines) when
/// the code runs far slower than usual: `ILS_TEST_TIME_SCALE=4` multiplies each by 4. `deploy/sanitize.sh` sets it,
/// because AddressSanitizer and ThreadSanitizer make everything several times slower, and a test's deadline must stay
/// well clear of how long the work takes for the test to check ordering rather than speed.
public enum TestTiming {
    /// The factor, 1 unless `ILS_TEST_TIME_SCALE` holds a whole number from 1 to 100.
    public static let scale: Int64 = {
        guard let raw = ProcessInfo.processInfo.environment["ILS_TEST_TIME_SCALE"], let value = Int64(raw),
            (1...100).contains(value)
        else { return 1 }
        return value
    }()

    /// How long a test waits for an event that must come (`TestCluster.eventually`) before it calls the event
    /// missing: 60 s, stretched like every deadline. It is a guard against a hang, not a claim about speed: a healthy
    /// run sees the event in milliseconds, and a loaded 2-core machine once took 10 s to (issue 36).
    public static var hangGuard: Duration { scaled(Duration.seconds(60)) }

    public static func scaled(_ span: TimeSpan) -> TimeSpan { TimeSpan(nanoseconds: span.nanoseconds * scale) }

    public static func scaled(_ amount: TimeAmount) -> TimeAmount { .nanoseconds(amount.nanoseconds * scale) }

    public static func scaled(_ duration: Duration) -> Duration { duration * Int(scale) }

    /// A count of milliseconds, for intervals passed in URLs (`/sse?interval_ms=`).
    public static func scaled(milliseconds: Int) -> Int { milliseconds * Int(scale) }
}
