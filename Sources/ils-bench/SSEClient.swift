import NIOConcurrencyHelpers
import NIOCore
import NIOPosix

#if canImport(Glibc)
import Glibc
#endif

/// What every stream of an SSE run has seen, shared by the handlers (all on one event loop) and the driver.
final class SSEStats: @unchecked Sendable {
    private let lock = NIOLock()
    private var measuring = false
    private var latencies: [Double] = []
    private var events = 0
    private var closed = 0

    func record(latencyMicroseconds: Double) {
        lock.withLock {
            guard measuring else { return }
            events += 1
            latencies.append(latencyMicroseconds)
        }
    }

    func streamClosed() { lock.withLock { closed += 1 } }

    func startMeasuring() {
        lock.withLock {
            measuring = true
            latencies.removeAll(keepingCapacity: true)
            events = 0
        }
    }

    func stopMeasuring() -> (latencies: [Double], events: Int, closed: Int) {
        lock.withLock {
            measuring = false
            return (latencies, events, closed)
        }
    }
}

/// One SSE stream over raw HTTP/1.1: sends the request, treats the stream as established at the first byte after the
/// response head, and records `now - t` for every `data: t` line (t in monotonic nanoseconds from the backend).
final class SSEClientHandler: ChannelInboundHandler {
    typealias InboundIn = ByteBuffer

    private let request: String
    private let stats: SSEStats
    private let established: EventLoopPromise<Void>
    private var headDone = false
    private var line: [UInt8] = []
    private var head: [UInt8] = []

    init(request: String, stats: SSEStats, established: EventLoopPromise<Void>) {
        self.request = request
        self.stats = stats
        self.established = established
    }

    func channelActive(context: ChannelHandlerContext) {
        var buffer = context.channel.allocator.buffer(capacity: request.utf8.count)
        buffer.writeString(request)
        context.writeAndFlush(NIOAny(buffer), promise: nil)
        context.fireChannelActive()
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        let buffer = unwrapInboundIn(data)
        let now = monotonicNanoseconds()
        buffer.withUnsafeReadableBytes { bytes in
            var index = 0
            if !headDone {
                while index < bytes.count, !headDone {
                    head.append(bytes[index])
                    index += 1
                    if head.count >= 4, head.suffix(4).elementsEqual([13, 10, 13, 10]) { headDone = true }
                }
                if headDone {
                    if head.starts(with: Array("HTTP/1.1 200".utf8)) {
                        established.succeed(())
                    } else {
                        let text = String(decoding: head.prefix(120), as: UTF8.self)
                        established.fail(BenchError.message("SSE stream refused: \(text)"))
                    }
                }
            }
            while index < bytes.count {
                let byte = bytes[index]
                index += 1
                if byte == 10 {
                    consume(now: now)
                    line.removeAll(keepingCapacity: true)
                } else if line.count < 256 {
                    line.append(byte)
                }
            }
        }
    }

    private func consume(now: UInt64) {
        let prefix: [UInt8] = Array("data: ".utf8)
        guard line.count > prefix.count, line.starts(with: prefix) else { return }
        var value: UInt64 = 0
        for byte in line.dropFirst(prefix.count) {
            guard byte >= 48, byte <= 57 else { break }
            value = value &* 10 &+ UInt64(byte - 48)
        }
        if value > 0, now >= value { stats.record(latencyMicroseconds: Double(now - value) / 1000) }
    }

    func channelInactive(context: ChannelHandlerContext) {
        stats.streamClosed()
        established.fail(BenchError.message("SSE stream closed before its response head"))
        context.fireChannelInactive()
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        established.fail(error)
        context.close(promise: nil)
    }
}

enum SSERun {
    /// Opens streams in steps, announcing each step on stdout (`STEP <n>`) and holding it for `hold` seconds so the
    /// harness can sample memory; then measures delivery latency over `measure` seconds with every stream open.
    static func run(
        host: String,
        port: Int,
        path: String,
        steps: [Int],
        batch: Int,
        hold: Int,
        measure: Int
    ) throws -> String {
        raiseDescriptorLimit()
        let group = MultiThreadedEventLoopGroup(numberOfThreads: 1)
        defer { try? group.syncShutdownGracefully() }
        let stats = SSEStats()
        let request = "GET \(path) HTTP/1.1\r\nHost: \(host):\(port)\r\nAccept: text/event-stream\r\n\r\n"
        var channels: [any Channel] = []
        let started = monotonicNanoseconds()
        for step in steps {
            while channels.count < step {
                let size = min(batch, step - channels.count)
                let opened = (0..<size).map { _ in
                    open(group: group, host: host, port: port, request: request, stats: stats)
                }
                for future in opened { channels.append(try future.wait()) }
            }
            let seconds = Double(monotonicNanoseconds() - started) / 1e9
            print("STEP \(step) \((seconds * 10).rounded() / 10)")
            fflush(nil)
            sleep(UInt32(hold))
        }
        stats.startMeasuring()
        sleep(UInt32(measure))
        let result = stats.stopMeasuring()
        for channel in channels { channel.close(promise: nil) }
        let summary = Summary(result.latencies)
        let expected = channels.count * measure
        return """
            {"streams": \(channels.count), "closed_early": \(result.closed), "events": \(result.events), \
            "expected_events": \(expected), "p50_us": \(summary.percentile(50)), "p99_us": \(summary.percentile(99)), \
            "max_us": \(summary.percentile(100))}
            """
    }

    private static func open(
        group: MultiThreadedEventLoopGroup,
        host: String,
        port: Int,
        request: String,
        stats: SSEStats
    ) -> EventLoopFuture<any Channel> {
        let loop = group.next()
        let established = loop.makePromise(of: Void.self)
        return ClientBootstrap(group: loop)
            .channelOption(.tcpOption(.tcp_nodelay), value: 1)
            .connectTimeout(.seconds(10))
            .channelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    try channel.pipeline.syncOperations.addHandler(
                        SSEClientHandler(request: request, stats: stats, established: established)
                    )
                }
            }
            .connect(host: host, port: port)
            .flatMap { channel in established.futureResult.map { channel } }
    }
}

/// Lifts the soft descriptor limit to the hard one: 10,000 streams need more than the usual 1,024.
func raiseDescriptorLimit() {
    var limit = rlimit()
    getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit)
    limit.rlim_cur = limit.rlim_max
    setrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit)
}
