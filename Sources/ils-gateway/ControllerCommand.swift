import ArgumentParser
import Foundation
import ILSConfig
import ILSController
import ILSCore
import ILSStore
import ILSStorePostgres
import Logging

/// `ils-gateway controller`: the overlay controller.
struct ControllerCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "controller",
        abstract: "Create and run the overlay controller (CA, identity store, enrollment, admin API).",
        discussion: """
            Examples:
              ils-gateway controller init --state-dir /var/lib/ils --address https://ctl.example.net:7443
              ils-gateway controller run --state-dir /var/lib/ils
            """,
        subcommands: [Init.self, Join.self, Run.self, Migrate.self, RotateTLS.self]
    )

    struct StateDirectory: ParsableArguments {
        @Option(help: "Controller state directory (CA, keys, SQLite store). Env: ILS_STATE_DIR.")
        var stateDir: String?

        @Option(
            help: """
                The store: a SQLite file (default: DIR/store.sqlite) or a PostgreSQL URL that several controllers \
                share, postgres://USER@HOST:PORT/DB?sslmode=verify-full (the password may come from PGPASSWORD). \
                Env: ILS_STORE.
                """
        )
        var store: String?

        /// The store `text` names, opened; nil (the state directory's SQLite file) when there is none.
        static func openStore(_ text: String?, logger: Logger) async throws(ILSError) -> (any ControllerStore)? {
            guard let text else { return nil }
            return try await StoreOpener.open(try StoreLocation(parsing: text), logger: logger)
        }

        func resolved() throws(ILSError) -> String {
            guard let directory = stateDir ?? ProcessEnvironment()["ILS_STATE_DIR"] else {
                throw ILSError(.invalidArgument, "give --state-dir DIR (or set ILS_STATE_DIR)")
            }
            return directory
        }
    }

    struct Init: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Create a controller: CA, TLS certificate, token key, store, the claude-api service, an admin.",
            discussion: """
                Refuses to touch a directory that already has files in it. Private keys are written with mode 0600.

                Example:
                  ils-gateway controller init --state-dir /var/lib/ils --address https://ctl.example.net:7443
                """
        )

        @OptionGroup var state: StateDirectory

        @Option(help: "The URL devices and gateways will dial, https://HOST:PORT. It goes into every token.")
        var address: String

        @Option(help: "Where to write the admin identity file.")
        var adminOut: String = "identities/admin.json"

        func run() async throws {
            let directory = try state.resolved()
            let address = try ControllerAddress(parsing: address)
            let logger = Logger(label: "ils-controller", factory: { _ in SwiftLogNoOpLogHandler() })
            let controller = try await ControllerState.initialize(
                directory: directory,
                address: address,
                adminOut: adminOut,
                store: try await StateDirectory.openStore(
                    state.store ?? ProcessEnvironment()["ILS_STORE"],
                    logger: logger
                )
            )
            print("controller state created in \(directory)")
            print("CA fingerprint (sha256): \(controller.authority.fingerprint)")
            print("admin identity written to \(adminOut) (keep it private)")
            print("next: ils-gateway controller run --state-dir \(directory)")
        }
    }

    struct Run: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Serve enrollment and the admin API on the controller's one TLS port.",
            discussion: """
                Each setting comes from its flag, else its environment variable, else the --config file, else the \
                default.

                Examples:
                  ils-gateway controller run --state-dir /var/lib/ils --listen 0.0.0.0:7443
                  ils-gateway controller run --config /etc/ils-gateway/controller.yaml
                """
        )

        @OptionGroup var state: StateDirectory

        @Option(help: "HOST:PORT to listen on. Env: ILS_LISTEN. Default: 0.0.0.0 and the controller address's port.")
        var listen: String?

        @OptionGroup var connectionOptions: ControllerConnectionOptions
        @OptionGroup var configOptions: ConfigOptions
        @OptionGroup var logOptions: LogOptions
        @OptionGroup var metricsOptions: MetricsOptions
        @OptionGroup var auditOptions: AuditRetentionOptions
        @OptionGroup var keepaliveOptions: KeepaliveOptions

        func run() async throws {
            let layers = try configOptions.layers(.controllerRun)
            guard let directory = layers.string(.stateDir, flag: state.stateDir) else {
                throw ILSError(
                    .invalidArgument,
                    "give --state-dir DIR (or set ILS_STATE_DIR, or state-dir in the config file)"
                )
            }
            let logger = try logOptions.bootstrap(label: "ils-controller", layers: layers)
            let store = try await StateDirectory.openStore(layers.string(.store, flag: state.store), logger: logger)
            let controllerState = try await ControllerState.load(directory: directory, store: store)
            let listenAddress: HostPort
            if let listen = layers.string(.listen, flag: listen) {
                listenAddress = try HostPort(parsing: listen)
            } else {
                listenAddress = HostPort(host: "0.0.0.0", port: controllerState.address.port)
            }
            let metrics = try metricsOptions.server(logger: logger, layers: layers, ready: { true })
            let server = try ControllerServer(
                state: controllerState,
                listen: listenAddress,
                logger: logger,
                keepalive: try keepaliveOptions.resolve(layers),
                requestTimeouts: try connectionOptions.requestTimeouts(layers),
                connectionLimits: try connectionOptions.limits(layers),
                circuitLimits: try connectionOptions.circuitLimits(layers),
                releaseMemory: { MemoryTuning.trim() }
            )
            let maintenance = server.maintenance(retention: try auditOptions.retention(layers))
            let heartbeat = ControllerHeartbeat(state: controllerState, logger: logger)
            if let metrics {
                try await runUntilSignalled(server, maintenance, heartbeat, metrics, logger: logger)
            } else {
                try await runUntilSignalled(server, maintenance, heartbeat, logger: logger)
            }
        }
    }
}
