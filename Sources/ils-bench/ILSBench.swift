import ArgumentParser
import Foundation

/// The peer of the benchmark harness (deploy/bench/run.py): a backend that is never the bottleneck, and the load
/// clients that wrk and curl don't cover.
@main
struct ILSBench: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "ils-bench",
        abstract: "Benchmark backend and load clients for deploy/bench/run.py.",
        subcommands: [Backend.self, SSE.self, Relay.self, Handshake.self]
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
                "Relay TCP from HOST:PORT to HOST:TARGET, plain and on one event loop (the benchmark's NIO floor).",
            discussion: "Example: ils-bench relay --port 9001 --target 9000"
        )
        @Option(help: "Address to listen on and to connect to.") var host = "127.0.0.1"
        @Option(help: "Port to listen on.") var port: Int
        @Option(help: "Port to relay each connection to.") var target: Int

        func run() throws { try PlainRelay.run(host: host, port: port, target: target) }
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
