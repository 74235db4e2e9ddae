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

    init(own: ControllerAddress) {
        addresses = NIOLockedValueBox([own.description])
    }

    /// The list as last read, this controller first.
    public var current: [String] { addresses.withLockedValue { $0 } }

    /// The list once it has been read from the store at least once; nil before (a client told only this controller
    /// in its first moment would write that into its identity file over a longer list).
    public var announced: [String]? { read.withLockedValue { $0 } ? current : nil }

    /// Reads the list from the store and pushes it to every gateway if it changed (a store that cannot answer changes
    /// nothing). Returns whether it changed.
    @discardableResult
    func refresh(controller: Controller, live: LiveConnections) async -> Bool {
        // A store that cannot answer says nothing about the cluster: the list stays as it was.
        guard let list = try? await controller.listedControllerAddresses() else { return false }
        defer { read.withLockedValue { $0 = true } }
        // Compared as sets: the store's order among the others is not a change.
        let changed = addresses.withLockedValue { addresses -> Bool in
            guard Set(addresses) != Set(list) else { return false }
            addresses = list
            return true
        }
        if changed { live.push(HostControlMessage(controllers: list)) }
        return changed
    }
}
