import Foundation
import NIOConcurrencyHelpers

#if canImport(Glibc)
import Glibc
#endif

/// A real PostgreSQL server for one test process: Debian's PostgreSQL (15 or whichever is installed), `initdb` into
/// a temporary directory, listening on a Unix socket there and on 127.0.0.1 at a free port, with password
/// authentication over TCP (`scram-sha-256`) for the user `ils`. Started and stopped by the tests, which may also
/// stop, restart or kill it to play a store outage.
///
/// PostgreSQL refuses to run as root; when the tests do (CI does), the server runs as Debian's `postgres` user.
/// Missing PostgreSQL fails loudly, unless `ILS_SKIP_POSTGRES=1` (then `TestPostgres.skipReason` says why).
public final class TestPostgres: Sendable {
    public let directory: String
    /// The server's TCP port on 127.0.0.1 (another one if the first was taken before the server bound it).
    public var port: Int { chosenPort.withLockedValue { $0 } }
    public static let user = "ils"
    /// A fixed test password: tests check it never appears in a message.
    public static let password = "pg-test-secret-7c1f"

    private let binaries: String
    private let asPostgres: Bool
    private let nextDatabase = NIOLockedValueBox(0)
    private let chosenPort: NIOLockedValueBox<Int>

    /// Set when the PostgreSQL tests should not run here (`ILS_SKIP_POSTGRES=1`).
    public static var skipReason: String? {
        ProcessInfo.processInfo.environment["ILS_SKIP_POSTGRES"] == "1" ? "ILS_SKIP_POSTGRES=1" : nil
    }

    /// One server for the whole test process, started on first use.
    public static func shared() throws -> TestPostgres {
        try sharedServer.withLockedValue { server in
            if let server { return server }
            _ = stopAtExit
            let started = try TestPostgres()
            server = started
            return started
        }
    }

    private static let sharedServer = NIOLockedValueBox<TestPostgres?>(nil)

    /// The shared server is stopped when the test process exits (a static is never deinitialised).
    private static let stopAtExit: Void = {
        atexit {
            TestPostgres.sharedServer.withLockedValue { server in
                server?.stopForExit()
                server = nil
            }
        }
    }()

    private func stopForExit() {
        _ = try? run("\(binaries)/pg_ctl", ["-D", "\(directory)/data", "-m", "immediate", "-w", "stop"])
        try? FileManager.default.removeItem(atPath: directory)
    }

    public init() throws {
        let versions =
            (try? FileManager.default.contentsOfDirectory(atPath: "/usr/lib/postgresql"))?
            .compactMap(Int.init).sorted() ?? []
        guard let version = versions.last else {
            throw Failure(
                "PostgreSQL is not installed (no /usr/lib/postgresql/*/bin): apt-get install postgresql, "
                    + "or set ILS_SKIP_POSTGRES=1 to skip these tests"
            )
        }
        binaries = "/usr/lib/postgresql/\(version)/bin"
        asPostgres = geteuid() == 0
        directory =
            FileManager.default.temporaryDirectory.appendingPathComponent("ils-pg-\(UUID().uuidString.prefix(8))")
            .path
        chosenPort = NIOLockedValueBox(try TestCluster.freePort())
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        if asPostgres { try run("/bin/chown", ["postgres:postgres", directory], asServerUser: false) }
        try FileManager.default.setAttributes([.posixPermissions: 0o700], ofItemAtPath: directory)
        try "\(Self.password)\n".write(toFile: "\(directory)/pw", atomically: true, encoding: .utf8)
        if asPostgres { try run("/bin/chown", ["postgres:postgres", "\(directory)/pw"], asServerUser: false) }
        try run(
            "\(binaries)/initdb",
            [
                "-D", "\(directory)/data", "-U", Self.user, "--pwfile=\(directory)/pw", "--auth-local=trust",
                "--auth-host=scram-sha-256", "-E", "UTF8", "--no-sync", "--locale=C",
            ]
        )
        // A free port is a hint, not a reservation: between `freePort` closing it and the server binding it, another
        // test of this process may take it (a listener of its own on port 0). Then another port, a few times.
        for attempt in 1...3 {
            do {
                try start()
                return
            } catch let failure as Failure where attempt < 3 && failure.description.contains("Address already in use") {
                chosenPort.withLockedValue { $0 = (try? TestCluster.freePort()) ?? $0 }
                // pg_ctl appends to the log: the next attempt's failure, if any, must be judged by its own lines.
                try? FileManager.default.removeItem(atPath: "\(directory)/server.log")
            }
        }
    }

    deinit {
        _ = try? run("\(binaries)/pg_ctl", ["-D", "\(directory)/data", "-m", "immediate", "-w", "stop"])
        try? FileManager.default.removeItem(atPath: directory)
    }

    /// Starts the server (after `stop` or `kill`); returns when it accepts connections.
    public func start() throws {
        try run(
            "\(binaries)/pg_ctl",
            [
                "-D", "\(directory)/data", "-l", "\(directory)/server.log", "-w", "-t", "60", "-o",
                "-k \(directory) -p \(port) -h 127.0.0.1 -c fsync=off -c full_page_writes=off -c max_connections=200",
                "start",
            ]
        )
    }

    /// Stops the server cleanly (connections are closed).
    public func stop() throws {
        try run("\(binaries)/pg_ctl", ["-D", "\(directory)/data", "-m", "fast", "-w", "stop"])
    }

    /// Stops and starts the server again.
    public func restart() throws {
        try stop()
        try start()
    }

    /// A fresh, empty database; returns its URL over TCP with the password.
    public func createDatabase() throws -> String {
        let name = nextDatabase.withLockedValue { number in
            number += 1
            return "ils_\(getpid())_\(number)"
        }
        try run("\(binaries)/createdb", ["-h", directory, "-p", "\(port)", "-U", Self.user, name])
        return url(database: name)
    }

    /// The URL of `database` over TCP on 127.0.0.1, with the password.
    public func url(database: String) -> String {
        "postgres://\(Self.user):\(Self.password)@127.0.0.1:\(port)/\(database)?sslmode=disable"
    }

    /// The URL of `database` over the Unix socket (no password: local connections are trusted).
    public func socketURL(database: String) -> String {
        "postgres://\(Self.user)@/\(database)?host=\(directory)&port=\(port)"
    }

    /// Runs `sql` with `psql` over the Unix socket as the test user, in `database`; returns its unaligned rows, one
    /// per line (`psql -At`).
    public func psql(_ sql: String, database: String) throws -> String {
        try run(
            "\(binaries)/psql",
            ["-h", directory, "-p", "\(port)", "-U", Self.user, "-d", database, "-At", "-c", sql]
        )
    }

    /// The server processes of `database` that hold a `LISTEN` (a controller store's change feed), by pid.
    public func listeningProcesses(database: String) throws -> [Int32] {
        try psql(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND query LIKE 'LISTEN%'",
            database: database
        ).split(separator: "\n").compactMap { Int32($0) }
    }

    /// The database name in a URL `createDatabase` made.
    public static func databaseName(_ url: String) -> String {
        String(url.split(separator: "/").last?.split(separator: "?").first ?? "")
    }

    /// The postmaster's pid (the first line of its `postmaster.pid`): the process every server process is forked from.
    public func serverProcessID() throws -> Int32 {
        let text = Self.text(of: "\(directory)/data/postmaster.pid")
        guard let line = text.split(separator: "\n").first, let pid = Int32(line) else {
            throw Failure("PostgreSQL's postmaster.pid in \(directory)/data names no process")
        }
        return pid
    }

    /// Sends `signal` to one of the server's processes (a backend's pid from `pg_stat_activity`): `SIGSTOP` makes
    /// that one connection go silent, as a NAT that forgets a flow would, while the server goes on answering others.
    public func signal(_ signal: Int32, process pid: Int32) throws {
        guard kill(pid, signal) == 0 else {
            throw Failure("could not signal PostgreSQL process \(pid): errno \(errno)")
        }
    }

    /// Runs a command to its end with `posix_spawn` and `waitpid`. Foundation's `Process` is not used here: on Linux
    /// its exit monitoring left `pg_ctl`'s parent unreaped (a zombie) and the test waiting forever.
    @discardableResult
    private func run(_ executable: String, _ arguments: [String], asServerUser: Bool = true) throws -> String {
        let argv0 = asServerUser && asPostgres ? "/usr/sbin/runuser" : executable
        let argv =
            (asServerUser && asPostgres ? ["/usr/sbin/runuser", "-u", "postgres", "--", executable] : [executable])
            + arguments
        // A file, not a pipe: `pg_ctl start` leaves the server running with its output inherited.
        let outputPath = "\(directory)/command.\(UUID().uuidString.prefix(8)).log"
        defer { try? FileManager.default.removeItem(atPath: outputPath) }
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
        posix_spawn_file_actions_addopen(&actions, 1, outputPath, O_WRONLY | O_CREAT | O_TRUNC, 0o644)
        posix_spawn_file_actions_adddup2(&actions, 1, 2)
        // Nothing else of this process: `pg_ctl start` leaves a server running, and a server that inherited a test's
        // listening socket kept it listening after the test closed it, so a controller restarted on its port got
        // EADDRINUSE (`AdminAPITests.restartKeepsIdentities`, run beside the PostgreSQL store tests).
        Self.closeInheritedDescriptors(&actions)
        let cArguments = argv.map { strdup($0) } + [nil]
        defer { for argument in cArguments { free(argument) } }
        var pid: pid_t = 0
        let spawned = posix_spawn(&pid, argv0, &actions, nil, cArguments, environ)
        guard spawned == 0 else { throw Failure("could not start \(argv0): error \(spawned)") }
        var status: Int32 = 0
        while waitpid(pid, &status, 0) < 0 && errno == EINTR {}
        let exitCode = (status & 0x7f) == 0 ? (status >> 8) & 0xff : 128 + (status & 0x7f)
        guard exitCode == 0 else {
            let text = Self.text(of: outputPath)
            let log = Self.text(of: "\(directory)/server.log")
            throw Failure(
                "\((executable as NSString).lastPathComponent) failed (\(exitCode)): \(text)\n"
                    + String(log.suffix(2000))
            )
        }
        return Self.text(of: outputPath)
    }

    /// A file's text, or "" when it is empty or unreadable. An empty file is not handed to
    /// `String(contentsOfFile:)`: FoundationEssentials (Swift 6.3) reads it into a 4 KiB buffer it never frees, which
    /// LeakSanitizer reported 31 times per store-suite run (most psql commands print nothing).
    private static func text(of path: String) -> String {
        guard let size = try? FileManager.default.attributesOfItem(atPath: path)[.size] as? Int, size > 0 else {
            return ""
        }
        return (try? String(contentsOfFile: path, encoding: .utf8)) ?? ""
    }

    /// Adds "close every descriptor from 3 up" to `actions`: glibc's `posix_spawn_file_actions_addclosefrom_np`
    /// (2.34 and later; Swift's Glibc module does not export it, so it is looked up), or else marks every open
    /// descriptor close-on-exec.
    private static func closeInheritedDescriptors(_ actions: inout posix_spawn_file_actions_t) {
        typealias CloseFrom = @convention(c) (UnsafeMutablePointer<posix_spawn_file_actions_t>, Int32) -> Int32
        if let symbol = dlsym(UnsafeMutableRawPointer(bitPattern: 0), "posix_spawn_file_actions_addclosefrom_np"),
            unsafeBitCast(symbol, to: CloseFrom.self)(&actions, 3) == 0
        {
            return
        }
        let open = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/fd")) ?? []
        for descriptor in open.compactMap({ Int32($0) }) where descriptor > 2 {
            _ = fcntl(descriptor, F_SETFD, fcntl(descriptor, F_GETFD) | FD_CLOEXEC)
        }
    }

    public struct Failure: Error, CustomStringConvertible {
        public let description: String
        init(_ description: String) { self.description = description }
    }
}
