import Foundation
import ILSCore
import ILSStore
import ILSStorePostgres
import ILSTesting
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// What only a shared store does: tell one controller what another wrote, and live through a server restart.
@Suite("PostgreSQL store: change feed, restarts, outages, migration", .serialized, .timeLimit(.minutes(3)))
struct PostgresStoreTests {
    /// Waits for the first change the feed yields that `matches`, reading at most `limit` changes.
    private static func next(
        _ iterator: inout AsyncStream<StoreChange>.Iterator,
        matching matches: (StoreChange) -> Bool,
        limit: Int = 50
    ) async -> StoreChange? {
        for _ in 0..<limit {
            guard let change = await iterator.next() else { return nil }
            if matches(change) { return change }
        }
        return nil
    }

    /// The next change that is not a heartbeat's (`warmUp` may leave some of those in flight).
    private static func nextIgnoringHeartbeats(_ iterator: inout AsyncStream<StoreChange>.Iterator) async
        -> StoreChange?
    {
        await next(&iterator) { $0 != .controllers }
    }

    /// Writes a heartbeat of a new member through `writer` every 100 ms until `feed` hears one. The feed starts
    /// listening in the background, and a notification sent before that is lost to it: one write could wait forever.
    /// Each beat is a new address, since only a member's first beat notifies (the same address beat again, as
    /// before, could leave the feed nothing to hear).
    private static func warmUp(_ feed: inout AsyncStream<StoreChange>.Iterator, writer: some ControllerStore) async {
        let beats = Task {
            var beat = 0
            while !Task.isCancelled {
                beat += 1
                let member = ControllerMember(address: "https://warm-\(beat):1", startedAt: 1, lastSeenAt: 1)
                try? await writer.heartbeat(member)
                try? await Task.sleep(for: .milliseconds(100))
            }
        }
        _ = await next(&feed) { $0 == .controllers }
        beats.cancel()
        _ = await beats.value
    }

    @Test("a revocation written through one controller's client reaches the other's feed, after the commit")
    func feedAcrossClients() async throws {
        let (store, other, cleanup) = try await StoreKind.postgres.make()
        var feed = store.changes().makeAsyncIterator()
        // The feed listens asynchronously: wait until it hears a write before counting on it.
        await Self.warmUp(&feed, writer: other)
        let ipad = try await enrolled("ipad", in: other)
        // Created, then enrolled: two notifications, in commit order.
        #expect(await Self.nextIgnoringHeartbeats(&feed) == .identity(id: ipad.id))
        #expect(await Self.nextIgnoringHeartbeats(&feed) == .identity(id: ipad.id))
        _ = try await other.changeState(named: "ipad", to: .revoked, actor: "admin")
        #expect(await Self.nextIgnoringHeartbeats(&feed) == .identity(id: ipad.id))
        // Heard after the commit: a read now sees the revocation.
        #expect(try await store.identity(id: ipad.id)?.state == .revoked)
        // A refused write notifies nothing: the next change heard is the service created after it.
        _ = await refusal { _ = try await other.changeState(named: "ipad", to: .active, actor: "admin") }
        try await other.createService(ServiceRecord(name: "console", dialRoles: [.admin], bindRoles: [.gateway]))
        #expect(await Self.nextIgnoringHeartbeats(&feed) == .services)
        await cleanup()
    }

    @Test("the server the tests start inherits no descriptor: a socket open while it started is not among its own")
    func serverInheritsNoDescriptors() throws {
        // A listening socket as NIO makes one (no close-on-exec), open while the server starts.
        let listener = try Self.listen(port: 0)
        defer { close(listener) }
        var status = stat()
        #expect(fstat(listener, &status) == 0)
        let server = try TestPostgres()
        // The server's own descriptors, as the kernel names them. Not "is its port free again after a close": other
        // tests of this process connect and listen meanwhile, and one of them may take the port (a flake, stop 45).
        let pid = try server.serverProcessID()
        let table = "/proc/\(pid)/fd"
        let descriptors = try FileManager.default.contentsOfDirectory(atPath: table).map {
            try FileManager.default.destinationOfSymbolicLink(atPath: "\(table)/\($0)")
        }
        // Read for real: the server's own listening sockets are there.
        #expect(descriptors.contains { $0.hasPrefix("socket:[") })
        #expect(!descriptors.contains("socket:[\(status.st_ino)]"), "the server holds the test's listening socket")
    }

    /// A listening TCP socket on 127.0.0.1:`port` (0: any), with SO_REUSEADDR as the project's servers set it.
    private static func listen(port: Int) throws -> Int32 {
        let descriptor = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        var on: Int32 = 1
        setsockopt(descriptor, SOL_SOCKET, SO_REUSEADDR, &on, socklen_t(MemoryLayout<Int32>.size))
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = UInt16(port).bigEndian
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        let bound = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                bind(descriptor, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
            }
        }
        guard descriptor >= 0, bound == 0, Glibc.listen(descriptor, 16) == 0 else {
            let failure = errno
            close(descriptor)
            throw ILSError(.unavailable, "could not listen on 127.0.0.1:\(port): errno \(failure)")
        }
        return descriptor
    }

    @Test("a server restart: calls work again by themselves and the feed says to read everything again")
    func restart() async throws {
        // A server of its own: the other suites share one and run meanwhile.
        let server = try TestPostgres()
        let url = try server.createDatabase()
        let store = try await PostgresControllerStore(url: url, logger: StoreKind.logger)
        let other = try await PostgresControllerStore(url: url, logger: StoreKind.logger)
        let cleanup = {
            await store.close()
            await other.close()
        }
        var feed = store.changes().makeAsyncIterator()
        await Self.warmUp(&feed, writer: other)
        try server.restart()
        #expect(await Self.next(&feed) { $0 == .resynchronize } == .resynchronize)
        // Polls until the store has reconnected by itself (a query works): the event waited for.
        var worked = false
        for _ in 0..<50 where !worked {
            worked = (try? await store.identities()) != nil
            if !worked { try await Task.sleep(for: .milliseconds(100)) }
        }
        #expect(worked)
        let ipad = try await enrolled("ipad", in: other)
        #expect(await Self.next(&feed) { $0 == .identity(id: ipad.id) } != nil)
        await cleanup()
    }

    @Test(
        "a feed whose connection goes silent listens on a new one and says to read everything again",
        .timeLimit(.minutes(1))
    )
    func silentFeed() async throws {
        let server = try TestPostgres.shared()
        let url = try server.createDatabase()
        let database = TestPostgres.databaseName(url)
        // Probes every half second here; a minute's time limit stands for "never" without them.
        let probe = ChangeFeedProbe(interval: .milliseconds(500), bound: .milliseconds(500))
        let store = try await PostgresControllerStore(url: url, logger: StoreKind.logger, feedProbe: probe)
        let other = try await PostgresControllerStore(url: url, logger: StoreKind.logger)
        var feed = store.changes().makeAsyncIterator()
        await Self.warmUp(&feed, writer: other)
        let listening = { try server.listeningProcesses(database: database) }
        let listeners = try listening()
        try #require(listeners.count == 1, "one listening connection: \(listeners)")
        // The listening connection's server process stops: its socket stays open and nothing it should send arrives.
        try server.signal(SIGSTOP, process: listeners[0])
        defer { try? server.signal(SIGCONT, process: listeners[0]) }
        let lost = try await enrolled("ipad", in: other)
        #expect(await Self.next(&feed) { $0 == .resynchronize } == .resynchronize)
        // Listening again, on another connection: what is written now is heard.
        let heard = try await enrolled("mac", in: other)
        #expect(await Self.next(&feed) { $0 == .identity(id: heard.id) } != nil)
        #expect(lost.id != heard.id)
        let now = try listening()
        #expect(now.contains { $0 != listeners[0] }, "a new listening connection: \(now)")
        await store.close()
        await other.close()
    }

    @Test("with the server down a call fails as unavailable, bounded, and never shows the password")
    func outage() async throws {
        let server = try TestPostgres()
        let store = try await PostgresControllerStore(url: try server.createDatabase(), logger: StoreKind.logger)
        let cleanup = { await store.close() }
        try server.stop()
        defer { try? server.start() }
        let error = await refusal { _ = try await store.identities() }
        #expect(error?.code == .unavailable)
        let text = "\(error?.reason ?? "") \(error?.detail ?? "")"
        #expect(!text.contains(TestPostgres.password), "\(text)")
        #expect(text.contains("***") || !text.contains(TestPostgres.user + ":"))
        try server.start()
        await cleanup()
    }

    @Test("a URL with a password is never printed with it, and a wrong one is refused as unavailable")
    func urls() async throws {
        #expect(StoreLocation.redacted("postgres://ils:s3cret@db:5432/ils") == "postgres://ils:***@db:5432/ils")
        #expect(try StoreLocation(parsing: "/var/lib/ils/store.sqlite") == .sqlite(path: "/var/lib/ils/store.sqlite"))
        #expect(throws: ILSError.self) { try StoreLocation(parsing: "mysql://x@y/z") }
        let server = try TestPostgres.shared()
        let wrong = server.url(database: "postgres").replacingOccurrences(of: TestPostgres.password, with: "wrong-pw")
        let error = await refusal { _ = try await PostgresControllerStore(url: wrong, logger: StoreKind.logger) }
        #expect(error?.code == .unavailable)
        let text = "\(error?.reason ?? "") \(error?.detail ?? "")"
        #expect(!text.contains("wrong-pw"), "\(text)")
    }

    @Test("migrate copies a SQLite store to PostgreSQL with no identity, token or audit row lost")
    func migrate() async throws {
        let (source, _, cleanupSource) = try await StoreKind.sqlite.make()
        let (target, _, cleanupTarget) = try await StoreKind.postgres.make()
        try await source.createService(ServiceRecord(name: "claude-api", dialRoles: [.device], bindRoles: [.gateway]))
        let ipad = try await enrolled("ipad", in: source)
        try await source.replaceToken(token(for: ipad, jti: "outstanding"), actor: "admin")
        try await enrolled("gw", in: source, role: .gateway)
        try await enrolled("off", in: source)
        _ = try await source.changeState(named: "off", to: .disabled, actor: "admin")
        try await enrolled("lost", in: source)
        _ = try await source.changeState(named: "lost", to: .revoked, actor: "admin")
        let waiting = pendingIdentity("waiting")
        try await source.createIdentity(waiting, token: token(for: waiting), actor: "admin")
        for index in 0..<2500 { try await source.audit(actor: "t", action: "test.row", target: "\(index)", detail: "") }
        let summary = try await StoreMigration.copy(from: source, to: target)
        let sourceAudit = try await source.auditEntries(since: 0)
        #expect(summary.identities == 5 && summary.auditRows == sourceAudit.count)
        #expect(try await target.exportRecords() == source.exportRecords())
        #expect(try await target.auditEntries(since: 0) == sourceAudit)
        // Again into the now non-empty target: refused, nothing more written.
        let refused = await refusal { _ = try await StoreMigration.copy(from: source, to: target) }
        #expect(refused?.code == .conflict)
        #expect(try await target.auditEntries(since: 0).count == sourceAudit.count)
        await cleanupSource()
        await cleanupTarget()
    }
}
