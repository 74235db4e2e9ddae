import ArgumentParser
import Foundation
import NIOPosix

/// The peer of the benchmark harness (deploy/bench/run.py): a backend that is never the bottleneck, and the load
/// clients that wrk and curl don't cover.
@main
struct ILSBench: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "ils-bench",
        abstract: "Benchmark backend and load clients for deploy/bench/run.py.",
        subcommands: [Backend.self, SSE.self, Relay.self, Handshake.self, AEAD.self, Load.self]
    )

    struct Backend: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Serve /bytes/N, /upload, /small and /sse?interval_ms=M on HOST:PORT.",
            discussion: "Example: ils-bench backend --port 9000"
        )
        @Option(help: "Address to listen on.") var host = "127.0.0.1"
        @Option(help: "Port to listen on.") var port: Int
        @Option(help: "Event-loop threads.") var threads = 2

        func run() throws { try BenchBackend.run(host: host, port: port, threads: threads) }
    }

    struct Relay: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract:
                "Relay TCP from HOST:PORT to HOST:TARGET, plain, each connection on one event loop (the benchmark's NIO floor).",
            discussion: "Example: ils-bench relay --port 9001 --target 9000 --threads 2"
        )
        @Option(help: "Address to listen on and to connect to.") var host = "127.0.0.1"
        @Option(help: "Port to listen on.") var port: Int
        @Option(help: "Port to relay each connection to.") var target: Int
        @Option(help: "Event-loop threads; a connection and its upstream share one (1 to 64).") var threads = 1

        func validate() throws {
            guard (1...64).contains(threads) else { throw ValidationError("--threads must be 1 to 64") }
        }

        func run() throws { try PlainRelay.run(host: host, port: port, target: target, threads: threads) }
    }

    struct Handshake: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Time end-to-end handshakes and 64 KiB records per handshake version, in process; prints JSON.",
            discussion: "Example: ils-bench handshake --seconds 3"
        )
        @Option(help: "Seconds to spend on each measurement.") var seconds = 3.0

        func run() throws {
            let encoder = JSONEncoder()
            encoder.outputFormatting = [.prettyPrinted, .sortedKeys]
            print(String(decoding: try encoder.encode(try HandshakeBench.run(seconds: seconds)), as: UTF8.self))
        }
    }

    struct Load: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Load a path as the app does (ILSClient in process) or over TCP; prints JSON.",
            discussion: """
                TARGET is tcp:PORT (any path on 127.0.0.1) or overlay:IDENTITY-FILE:SERVICE (dialled through \
                ILSClient's OverlayDialer, in this process, as an app dials: no tunnel).
                Examples:
                  ils-bench load overlay:identities/bench-app.json:claude-api --mode latency
                  ils-bench load tcp:9000 --mode rps --connections 32 --seconds 8
                  ils-bench load overlay:identities/bench-app.json:claude-api --mode download --size-mib 512
                """
        )
        @Argument(help: "tcp:PORT or overlay:IDENTITY-FILE:SERVICE.") var target: String
        @Option(help: "What to measure.") var mode: LoadClient.Mode = .latency
        @Option(help: "Request path for latency and rps.") var path = "/small"
        @Option(help: "Timed requests (latency).") var count = 3000
        @Option(help: "Untimed requests first (latency).") var warmup = 200
        @Option(help: "Milliseconds between requests (latency).") var gapMs = 0.5
        @Option(help: "Connections (circuits) at once (rps).") var connections = 32
        @Option(help: "Seconds to run (rps).") var seconds = 8.0
        @Option(help: "MiB to move (download, upload).") var sizeMib = 512
        @Flag(help: "A new connection (circuit) per request, as URLSession through OverlayClient does.")
        var connectionPerRequest = false

        func validate() throws {
            guard count > 0, warmup >= 0, gapMs >= 0 else {
                throw ValidationError("--count must be above 0, --warmup and --gap-ms at least 0")
            }
            guard (1...1024).contains(connections), seconds > 0, seconds <= 600 else {
                throw ValidationError("--connections must be 1 to 1024, --seconds above 0 and at most 600")
            }
            guard (1...65536).contains(sizeMib), path.hasPrefix("/") else {
                throw ValidationError("--size-mib must be 1 to 65536, and --path must start with /")
            }
        }

        func run() throws {
            let group = MultiThreadedEventLoopGroup.singleton
            var options = LoadClient.Options()
            options.path = path
            options.count = count
            options.warmup = warmup
            options.gap = .nanoseconds(Int64(gapMs * 1e6))
            options.connections = connections
            options.seconds = seconds
            options.bytes = sizeMib << 20
            options.connectionPerRequest = connectionPerRequest
            let result = try LoadClient.run(
                target: try LoadClient.Target.parse(target, group: group),
                mode: mode,
                options: options,
                group: group
            )
            let encoder = JSONEncoder()
            encoder.outputFormatting = [.prettyPrinted, .sortedKeys]
            print(String(decoding: try encoder.encode(result), as: UTF8.self))
        }
    }

    struct AEAD: ParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "aead",
            abstract: "Time the end-to-end records' AES-256-GCM, in place and through swift-crypto's API; prints JSON.",
            discussion: "Example: ils-bench aead --seconds 1 --rounds 3 --sizes 1024,16384,65536"
        )
        @Option(help: "Seconds per measurement.") var seconds = 1.0
        @Option(help: "Measurements per implementation and size; the best counts.") var rounds = 3
        @Option(help: "Record sizes in bytes, comma-separated.") var sizes = "1024,16384,65536"

        func run() throws {
            let sizes = self.sizes.split(separator: ",").compactMap { Int($0) }
            guard !sizes.isEmpty, sizes.allSatisfy({ $0 > 0 && $0 <= 65536 }) else {
                throw ValidationError("--sizes takes byte counts from 1 to 65536, comma-separated")
            }
            let encoder = JSONEncoder()
            encoder.outputFormatting = [.prettyPrinted, .sortedKeys]
            let results = AEADBench.run(seconds: seconds, sizes: sizes, rounds: rounds)
            print(String(decoding: try encoder.encode(results), as: UTF8.self))
        }
    }

    struct SSE: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Hold many SSE streams open in steps, then measure event delivery latency; prints JSON.",
            discussion: "Example: ils-bench sse --port 8080 --steps 2500,5000,10000 --hold 5 --measure 10"
        )
        @Option(help: "IPv4 address of the path under test.") var host = "127.0.0.1"
        @Option(help: "Port of the path under test.") var port: Int
        @Option(help: "Request path.") var path = "/sse?interval_ms=1000"
        @Option(help: "Stream counts to reach one after another, comma-separated.") var steps = "1000"
        @Option(help: "Streams opened at once.") var batch = 200
        @Option(help: "Seconds to hold each step (memory is sampled meanwhile).") var hold = 3
        @Option(help: "Seconds of latency measurement with every stream open.") var measure = 10

        func run() throws {
            let counts = steps.split(separator: ",").compactMap { Int($0) }
            guard !counts.isEmpty else { throw ValidationError("--steps needs numbers, e.g. 1000,2000") }
            print(
                try SSERun.run(
                    host: host,
                    port: port,
                    path: path,
                    steps: counts,
                    batch: batch,
                    hold: hold,
                    measure: measure
                )
            )
        }
    }
}

extension LoadClient.Mode: ExpressibleByArgument {}
