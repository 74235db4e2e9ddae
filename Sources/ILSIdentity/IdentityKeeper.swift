public import Foundation
public import ILSCore
import NIOConcurrencyHelpers

/// Keeps a long-running process's identity current, for the overlay gateway, HTTP mode's policy link and the tunnel
/// alike: it renews the certificate itself when it is due (fewer than 30 days left, checked every `renewalCheck`),
/// and picks up a certificate renewed in the identity file by someone else (`ils-gateway renew` by hand or from a
/// timer; one `stat` every 2 s, see `IdentityFileWatcher`). The controller routes nothing to, and answers nothing on,
/// a connection made with a replaced certificate, so each owner moves its connections to the new one when told.
///
/// Logs nothing itself (the app links this): each change goes to the owner's `onChange`.
public final class IdentityKeeper: Sendable {
    /// What changed, for the owner to adopt and log.
    public enum Change: Sendable {
        /// The certificate was renewed here and written to the identity file.
        case renewed(IdentityFile)
        /// The identity file holds a certificate renewed elsewhere.
        case changedOnDisk(IdentityFile)
        /// A due renewal failed; it is tried again at the next check.
        case renewalFailed(ILSError)
    }

    public let path: String
    private let watcher: NIOLockedValueBox<IdentityFileWatcher>
    private let current: NIOLockedValueBox<IdentityFile>
    private let renewalCheck: Duration
    private let now: @Sendable () -> Date

    public init(
        path: String,
        current: IdentityFile,
        renewalCheck: Duration = .seconds(6 * 3600),
        now: @escaping @Sendable () -> Date = { Date() }
    ) {
        self.path = path
        self.watcher = NIOLockedValueBox(IdentityFileWatcher(path: path, current: current))
        self.current = NIOLockedValueBox(current)
        self.renewalCheck = renewalCheck
        self.now = now
    }

    /// The identity in use.
    public var identity: IdentityFile { current.withLockedValue { $0 } }

    /// Runs until cancelled, calling `onChange` with each change. `onChange` returns whether the new identity was
    /// adopted; one it cannot use is not taken as the identity in use.
    public func run(onChange: @Sendable (Change) -> Bool) async {
        let tick = min(IdentityFileWatcher.interval, renewalCheck)
        var sinceRenewalCheck: Duration = .zero
        while true {
            do {
                try await Task.sleep(for: tick)
            } catch {
                return
            }
            if let changed = changedOnDisk() {
                if onChange(.changedOnDisk(changed)) { current.withLockedValue { $0 = changed } }
                continue
            }
            sinceRenewalCheck += tick
            guard sinceRenewalCheck >= renewalCheck else { continue }
            sinceRenewalCheck = .zero
            guard Renewal.isDue(identity, now: now()) else { continue }
            do {
                let renewed = try await Renewal.renew(path: path)
                watcher.withLockedValue { $0.using(renewed) }
                if onChange(.renewed(renewed)) { current.withLockedValue { $0 = renewed } }
            } catch {
                _ = onChange(.renewalFailed(error))
            }
        }
    }

    /// A new certificate for this identity in the file, if there is one now (checked at once, as after the
    /// controller refused the certificate in use). The caller adopts it with `adopted`.
    public func changedOnDisk() -> IdentityFile? {
        let id = identity.identity.id
        return watcher.withLockedValue { $0.changed(identityID: id) }
    }

    /// Marks `file` as the identity in use (found by `changedOnDisk`, or renewed by the owner itself).
    public func adopted(_ file: IdentityFile) {
        current.withLockedValue { $0 = file }
        watcher.withLockedValue { $0.using(file) }
    }
}
