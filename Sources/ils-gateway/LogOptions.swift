public import ArgumentParser
public import Logging
import ServiceLifecycle

/// `--log-level` and `--log-format`, shared by every long-running command.
struct LogOptions: ParsableArguments {
    enum Format: String, ExpressibleByArgument, CaseIterable {
        case text
        case json
    }

    @Option(help: "Least severe level logged: trace, debug, info, notice, warning, error or critical.")
    var logLevel: Logger.Level = .info

    @Option(help: "text for people, json for log collectors (one object per line).")
    var logFormat: Format = .text

    /// Installs the process-wide log handler and returns the command's logger.
    func bootstrap(label: String) -> Logger {
        let level = logLevel
        let format = logFormat
        LoggingSystem.bootstrap { name in
            var handler = ConsoleLogHandler(label: name, format: format)
            handler.logLevel = level
            return handler
        }
        var logger = Logger(label: label)
        logger.logLevel = level
        return logger
    }
}

extension Logger.Level: @retroactive ExpressibleByArgument {}

/// Runs a long-lived service until SIGTERM or SIGINT asks it to shut down gracefully.
func runUntilSignalled(_ service: some Service, logger: Logger) async throws {
    let group = ServiceGroup(
        configuration: .init(
            services: [.init(service: service)],
            gracefulShutdownSignals: [.sigterm, .sigint],
            logger: logger
        )
    )
    try await group.run()
}
