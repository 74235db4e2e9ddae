public import ArgumentParser
import ILSConfig
import ILSCore
import ILSObservability
import ILSProxy
public import Logging
import ServiceLifecycle

/// `--log-level` and `--log-format`, shared by every long-running command.
struct LogOptions: ParsableArguments {
    enum Format: String, ExpressibleByArgument, CaseIterable {
        case text
        case json
    }

    @Option(help: "Least severe level logged: trace, debug, info, notice, warning, error or critical. Default: info.")
    var logLevel: Logger.Level?

    @Option(help: "text for people, json for log collectors (one object per line). Default: text.")
    var logFormat: Format?

    /// Installs the process-wide log handler and returns the command's logger.
    func bootstrap(label: String, layers: ConfigLayers) throws(ILSError) -> Logger {
        let (level, format) = try resolved(layers)
        // Lines a stalled reader of stderr made `LogWriter` drop are counted in a line of this command's format.
        let lineFormat = format.lineFormat
        LogWriter.standardError.dropNotice { count in
            LogLine.encode(
                format: lineFormat,
                level: "warning",
                label: label,
                message: "log lines dropped: standard error's reader did not keep up",
                fields: [(key: "dropped", value: String(count))]
            )
        }
        LoggingSystem.bootstrap { name in
            var handler = ConsoleLogHandler(label: name, format: format.lineFormat)
            handler.logLevel = level
            return handler
        }
        var logger = Logger(label: label)
        logger.logLevel = level
        return logger
    }

    /// Where the proxy writes its access lines: straight to stderr in this command's format; nil when the level
    /// leaves info lines out (the proxy then skips them).
    func accessLog(label: String, layers: ConfigLayers) throws(ILSError) -> (any AccessLogSink)? {
        let (level, format) = try resolved(layers)
        return level <= .info ? ConsoleAccessLog(label: label, format: format.lineFormat) : nil
    }

    private func resolved(_ layers: ConfigLayers) throws(ILSError) -> (Logger.Level, Format) {
        let level = try layers.parsed(.logLevel, flag: logLevel) { Logger.Level(rawValue: $0) } ?? .info
        let format = try layers.parsed(.logFormat, flag: logFormat) { Format(rawValue: $0) } ?? .text
        return (level, format)
    }
}

extension LogOptions.Format {
    var lineFormat: LogLineFormat {
        switch self {
        case .text: .text
        case .json: .json
        }
    }
}

extension Logger.Level: @retroactive ExpressibleByArgument {}

/// Runs long-lived services until SIGTERM or SIGINT asks them to shut down gracefully.
func runUntilSignalled(_ services: any Service..., logger: Logger) async throws {
    let group = ServiceGroup(
        configuration: .init(
            services: services.map { .init(service: $0) },
            gracefulShutdownSignals: [.sigterm, .sigint],
            logger: logger
        )
    )
    try await group.run()
}

/// `--metrics` and `--metrics-allow-remote`, shared by every long-running command.
struct MetricsOptions: ParsableArguments {
    @Option(
        help: """
            Serve Prometheus metrics, /healthz and /readyz on HOST:PORT (loopback only by default). \
            Env: ILS_METRICS.
            """
    )
    var metrics: String?

    @Flag(inversion: .prefixedNo, help: "Allow a non-loopback --metrics address. Default: off.")
    var metricsAllowRemote: Bool?

    /// Bootstraps metrics (before anything counts) and returns the listener to run, when asked for.
    func server(
        logger: Logger,
        layers: ConfigLayers,
        ready: @escaping @Sendable () -> Bool,
        beforeScrape: @escaping @Sendable () -> Void = {}
    ) throws(ILSError) -> MetricsServer? {
        guard let metrics = layers.string(.metrics, flag: metrics) else { return nil }
        return try MetricsServer(
            listen: try HostPort(parsing: metrics),
            allowRemote: layers.boolean(.metricsAllowRemote, flag: metricsAllowRemote),
            logger: logger,
            ready: ready,
            beforeScrape: beforeScrape
        )
    }
}
