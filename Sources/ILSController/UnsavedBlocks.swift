public import ILSCore
import NIOConcurrencyHelpers

/// Revocations and disablements in force on this controller that the store could not save (a full disk).
///
/// A revocation must take effect on live streams whatever the disk does: the connections are closed and the block
/// is pushed to every gateway first, and the block is kept here so this controller keeps refusing the identity
/// (connections, circuits, the API) until the store has it. `StoreMaintenance` retries saving it.
public final class UnsavedBlocks: Sendable {
    public struct Block: Sendable, Hashable {
        public var id: String
        public var name: String
        public var state: IdentityState
        /// The admin who asked for it, for the audit row written when it is saved.
        public var actor: String
    }

    private let blocks = NIOLockedValueBox<[String: Block]>([:])

    init() {}

    func add(id: String, name: String, state: IdentityState, actor: String) {
        blocks.withLockedValue { $0[id] = Block(id: id, name: name, state: state, actor: actor) }
    }

    func remove(id: String) {
        _ = blocks.withLockedValue { $0.removeValue(forKey: id) }
    }

    func block(id: String) -> Block? {
        blocks.withLockedValue { $0[id] }
    }

    public var all: [Block] {
        blocks.withLockedValue { Array($0.values) }
    }
}
