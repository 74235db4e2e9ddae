public import ILSCore
public import ILSStore
import NIOConcurrencyHelpers

/// What the data path reads, in memory: every identity's state and current certificate, and every service's
/// policy, so that authenticating a connection, opening a circuit or answering a gateway never waits on the store.
///
/// It is kept current three ways: this controller applies each of its own writes as the store returns it (a
/// revocation is in force here before the admin's command returns); `StoreFollower` applies what other controllers
/// wrote, from `ControllerStore.changes()`; and a full reload after the feed reports a gap and on every maintenance
/// pass repairs anything missed.
///
/// "Last seen" lives here too: authentication notes the time in memory and `StoreMaintenance` writes the batch, so a
/// request reads and never writes.
public final class IdentityDirectory: Sendable {
    private struct Contents {
        var identities: [String: IdentityRecord] = [:]
        var services: [String: ServiceRecord] = [:]
        var lastSeen: [String: Int64] = [:]
        /// Counts this controller's own changes (`apply`, `remove`); `stamps` says when each id last changed. A read
        /// from the store that started before an id's stamp is older than what is here and must not replace it (a
        /// revocation applied while a reload was reading would otherwise be undone until the next reload).
        var generation: UInt64 = 0
        var stamps: [String: UInt64] = [:]
        var servicesStamp: UInt64 = 0

        mutating func stamp(_ id: String) {
            generation += 1
            stamps[id] = generation
        }
    }

    private let contents = NIOLockedValueBox(Contents())

    public init() {}

    /// Replaces everything with what the store holds now.
    public func reload(from store: any ControllerStore) async throws(ILSError) {
        let start = contents.withLockedValue { $0.generation }
        let identities = try await store.identities()
        let services = try await store.services()
        contents.withLockedValue { contents in
            var fresh = Dictionary(identities.map { ($0.id, $0) }, uniquingKeysWith: { $1 })
            for (id, stamp) in contents.stamps where stamp > start { fresh[id] = contents.identities[id] }
            contents.identities = fresh
            contents.stamps = contents.stamps.filter { $0.value > start }
            if contents.servicesStamp <= start {
                contents.services = Dictionary(services.map { ($0.name, $0) }, uniquingKeysWith: { $1 })
            }
        }
    }

    /// Reads one identity again from the store; returns the record before and after (nil: absent).
    @discardableResult
    public func refresh(id: String, from store: any ControllerStore) async throws(ILSError)
        -> (before: IdentityRecord?, after: IdentityRecord?)
    {
        let start = contents.withLockedValue { $0.generation }
        let record = try await store.identity(id: id)
        return contents.withLockedValue { contents in
            let before = contents.identities[id]
            guard (contents.stamps[id] ?? 0) <= start else { return (before, before) }
            contents.identities[id] = record
            return (before, record)
        }
    }

    /// Reads every service again from the store; returns the services before and after.
    @discardableResult
    public func refreshServices(from store: any ControllerStore) async throws(ILSError)
        -> (before: [String: ServiceRecord], after: [String: ServiceRecord])
    {
        let start = contents.withLockedValue { $0.generation }
        let services = try await store.services()
        return contents.withLockedValue { contents in
            let before = contents.services
            guard contents.servicesStamp <= start else { return (before, before) }
            contents.services = Dictionary(services.map { ($0.name, $0) }, uniquingKeysWith: { $1 })
            return (before, contents.services)
        }
    }

    /// Applies a record the store just returned from this controller's write.
    public func apply(_ record: IdentityRecord) {
        contents.withLockedValue { contents in
            contents.stamp(record.id)
            contents.identities[record.id] = record
        }
    }

    public func remove(id: String) {
        contents.withLockedValue { contents in
            contents.stamp(id)
            contents.identities[id] = nil
            contents.lastSeen[id] = nil
        }
    }

    /// Applies a service this controller just wrote, unless the directory already holds a later revision of it
    /// (another controller's update, applied from the feed while this write was answering).
    public func apply(_ service: ServiceRecord) {
        contents.withLockedValue { contents in
            if let held = contents.services[service.name], held.revision > service.revision { return }
            contents.generation += 1
            contents.servicesStamp = contents.generation
            contents.services[service.name] = service
        }
    }

    /// Removes a service this controller just deleted.
    public func removeService(named name: String) {
        contents.withLockedValue { contents in
            contents.generation += 1
            contents.servicesStamp = contents.generation
            contents.services[name] = nil
        }
    }

    /// Every identity (a copy).
    public func all() -> [IdentityRecord] {
        contents.withLockedValue { Array($0.identities.values) }
    }

    /// Every service, by name (a copy).
    public func allServices() -> [String: ServiceRecord] {
        contents.withLockedValue { $0.services }
    }

    public func identity(id: String) -> IdentityRecord? {
        contents.withLockedValue { $0.identities[id] }
    }

    /// By name (a scan: only when the store cannot be read, for a block that must hold anyway).
    public func identity(named name: String) -> IdentityRecord? {
        contents.withLockedValue { $0.identities.values.first { $0.name == name } }
    }

    public func service(named name: String) -> ServiceRecord? {
        contents.withLockedValue { $0.services[name] }
    }

    /// Ids of identities that are revoked or disabled.
    public var blockedIDs: Set<String> {
        contents.withLockedValue { contents in
            Set(contents.identities.values.filter { $0.state == .revoked || $0.state == .disabled }.map(\.id))
        }
    }

    /// Notes that an identity authenticated at `time` (UNIX seconds); written by the next `takeLastSeen`'s caller.
    public func noteSeen(id: String, at time: Int64) {
        contents.withLockedValue { contents in
            if (contents.lastSeen[id] ?? 0) < time { contents.lastSeen[id] = time }
        }
    }

    /// The times noted since the last call, emptied.
    public func takeLastSeen() -> [String: Int64] {
        contents.withLockedValue { contents in
            defer { contents.lastSeen = [:] }
            return contents.lastSeen
        }
    }

    /// Puts back times whose write failed, keeping any newer one noted meanwhile.
    public func restoreLastSeen(_ times: [String: Int64]) {
        contents.withLockedValue { contents in
            contents.lastSeen.merge(times) { max($0, $1) }
        }
    }
}
