import Foundation
import Logging
import NIOConcurrencyHelpers

/// A memory leak on purpose, for tests only: with `ILS_TEST_LEAK_BYTES_PER_REQUEST=N` in the environment, every
/// request forwarded to a backend keeps N bytes of private memory until the process exits.
///
/// It exists only so that the soak's memory judge (deploy/soak/soak.py, `--inject-leak`) can be shown to fail a
/// process that really leaks, through the real binary and both networking modes (docs/testing.md). The variable is
/// read once, when the first proxy core is made; unset or 0, a request pays one comparison with a constant.
enum InjectedLeak {
    static let bytesPerRequest: Int = {
        guard let raw = ProcessInfo.processInfo.environment["ILS_TEST_LEAK_BYTES_PER_REQUEST"], let value = Int(raw),
            value > 0
        else { return 0 }
        return value
    }()

    private static let kept = NIOLockedValueBox<[[UInt8]]>([])

    /// Reads the variable and says so in the log when it is set: a gateway that leaks must never do it silently.
    static func announce(to logger: Logger) {
        guard bytesPerRequest > 0 else { return }
        logger.warning(
            "ILS_TEST_LEAK_BYTES_PER_REQUEST is set: every proxied request leaks memory on purpose (tests only)",
            metadata: ["bytes_per_request": "\(bytesPerRequest)"]
        )
    }

    /// Called once per request whose head goes to a backend. The bytes are written (not zero pages the kernel never
    /// backs), so they count in the process's resident private memory at once.
    static func requestForwarded() {
        guard bytesPerRequest > 0 else { return }
        let buffer = [UInt8](repeating: 0xA5, count: bytesPerRequest)
        kept.withLockedValue { $0.append(buffer) }
    }
}
