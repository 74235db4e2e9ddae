import ILSCore
import ILSFabric
import NIOConcurrencyHelpers

/// The controller list this controller has told its gateways (`HostControlMessage.controllers`): sent in every
/// binding answer, and pushed to every linked gateway when it changes, so a gateway links to a replica that joins
/// without a restart and stops redialling one that left.
///
/// The binding answer is written on an event loop, which must not wait for the store: it reads the list kept here,
/// which `refresh` brings up to date from the store (every heartbeat interval, and on the store's change feed).
public final class ControllerRoster: Sendable {
    private let addresses: NIOLockedValueBox<[String]>
    private let read = NIOLockedValueBox(false)
    /// The list last pushed to gateways (`announced` when it was pushed).
    private let pushed = NIOLockedValueBox<[String]?>(nil)
    private let started = ContinuousClock.now
    /// How long a controller that finds itself alone waits before it says so (`announced`).
    private let soloAnnounceAfter: NIOLockedValueBox<Duration>

    /// The heartbeat window: a replica is in the list while its last heartbeat is under 30 s old.
    static let heartbeatWindow: Duration = .seconds(ControllerHeartbeat.window)

    init(own: ControllerAddress, soloAnnounceAfter: Duration = ControllerRoster.heartbeatWindow) {
        addresses = NIOLockedValueBox([own.description])
        self.soloAnnounceAfter = NIOLockedValueBox(soloAnnounceAfter)
    }

    /// The list as last read, this controller first.
    public var current: [String] { addresses.withLockedValue { $0 } }

    /// The list clients are told to keep (`ils-controllers`), or nil when it cannot be trusted yet:
    /// - before it has been read from the store once (a client told only this controller in its first moment would
    ///   write that over a longer list);
    /// - when it names this controller alone, for a heartbeat window after start: after a cluster-wide outage the
    ///   first controller back finds no other heartbeat younger than 30 s, though the others are about to return, and
    ///   clients would forget them. A lone controller that stays alone is announced after the window.
    public var announced: [String]? {
        guard read.withLockedValue({ $0 }) else { return nil }
        let list = current
        if list.count == 1, ContinuousClock.now - started < soloAnnounceAfter.withLockedValue({ $0 }) { return nil }
        return list
    }

    /// Sets how long a lone controller waits before it announces itself (tests, whose clusters start in a moment).
    package func announceAloneAfter(_ wait: Duration) { soloAnnounceAfter.withLockedValue { $0 = wait } }

    /// Takes `list` as read from the store; returns whether it changed the set.
    func record(_ list: [String]) -> Bool {
        defer { read.withLockedValue { $0 = true } }
        // Compared as sets: the store's order among the others is not a change.
        return addresses.withLockedValue { addresses -> Bool in
            guard Set(addresses) != Set(list) else { return false }
            addresses = list
            return true
        }
    }

    /// Reads the list from the store (a store that cannot answer changes nothing) and pushes what may be announced
    /// (`announced`) to every gateway when that differs, as a set, from what was pushed last. Returns whether the
    /// list read changed.
    @discardableResult
    func refresh(controller: Controller, live: LiveConnections) async -> Bool {
        // A store that cannot answer says nothing about the cluster: the list stays as it was.
        guard let list = try? await controller.listedControllerAddresses() else { return false }
        let changed = record(list)
        if let announced {
            let push = pushed.withLockedValue { pushed -> Bool in
                guard pushed.map(Set.init) != Set(announced) else { return false }
                pushed = announced
                return true
            }
            if push { live.push(HostControlMessage(controllers: announced)) }
        }
        return changed
    }
}
