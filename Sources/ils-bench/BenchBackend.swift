import NIOCore
import NIOHTTP1
import NIOPosix

#if canImport(Glibc)
import Glibc
#endif

/// Monotonic nanoseconds (CLOCK_MONOTONIC), comparable between processes on one machine: the SSE events carry it so the
/// client can compute delivery latency without clock skew.
func monotonicNanoseconds() -> UInt64 {
    var now = timespec()
    clock_gettime(CLOCK_MONOTONIC, &now)
    return UInt64(now.tv_sec) * 1_000_000_000 + UInt64(now.tv_nsec)
}

/// The benchmark backend: fast enough that it is never the bottleneck of a path under test.
///
/// - `GET /bytes/N`: N zero bytes with a Content-Length, written as the socket drains (never buffered).
/// - `PUT|POST /upload`: reads and discards the body, answers with the byte count.
/// - `GET /small`: 1 KiB.
/// - `GET /sse?interval_ms=M`: an event stream; a comment at once, then `data: <monotonic ns>` every M ms, first at a
///   random phase so that 10,000 streams spread over the interval.
final class BenchBackendHandler: ChannelInboundHandler {
    typealias InboundIn = HTTPServerRequestPart
    typealias OutboundOut = HTTPServerResponsePart

    static let chunk = ByteBuffer(repeating: 0, count: 256 * 1024)
    static let small = ByteBuffer(repeating: UInt8(ascii: "x"), count: 1024)

    private enum Request {
        case download(Int)
        case upload
        case small
        case sse(intervalMilliseconds: Int64)
        case notFound
    }

    private var request: Request = .notFound
    private var keepAlive = true
    private var uploaded = 0
    private var downloadRemaining = 0
    private var streaming = false
    private var sseTick: Scheduled<Void>?

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        switch unwrapInboundIn(data) {
        case .head(let head):
            keepAlive = head.isKeepAlive
            uploaded = 0
            request = Self.route(head)
        case .body(let body):
            uploaded += body.readableBytes
        case .end:
            respond(context: context)
        }
    }

    private static func route(_ head: HTTPRequestHead) -> Request {
        let parts = head.uri.split(separator: "?", maxSplits: 1)
        let path = parts.first.map(String.init) ?? "/"
        if path.hasPrefix("/bytes/"), let count = Int(path.dropFirst("/bytes/".count)), count >= 0 {
            return .download(count)
        }
        switch (head.method, path) {
        case (.PUT, "/upload"), (.POST, "/upload"): return .upload
        case (.GET, "/small"): return .small
        case (.GET, "/sse"):
            var interval: Int64 = 1000
            if parts.count == 2 {
                for pair in parts[1].split(separator: "&") where pair.hasPrefix("interval_ms=") {
                    interval = Int64(pair.dropFirst("interval_ms=".count)) ?? interval
                }
            }
            return .sse(intervalMilliseconds: max(1, interval))
        default: return .notFound
        }
    }

    private func respond(context: ChannelHandlerContext) {
        switch request {
        case .download(let count):
            writeHead(context: context, status: .ok, length: count, contentType: "application/octet-stream")
            downloadRemaining = count
            streaming = true
            pumpDownload(context: context)
        case .upload:
            var body = context.channel.allocator.buffer(capacity: 24)
            body.writeString("\(uploaded)\n")
            writeWhole(context: context, body: body, contentType: "text/plain")
        case .small:
            writeWhole(context: context, body: Self.small, contentType: "text/plain")
        case .sse(let interval):
            var headers = HTTPHeaders()
            headers.add(name: "content-type", value: "text/event-stream")
            headers.add(name: "cache-control", value: "no-cache")
            context.write(
                wrapOutboundOut(.head(HTTPResponseHead(version: .http1_1, status: .ok, headers: headers))),
                promise: nil
            )
            var hello = context.channel.allocator.buffer(capacity: 8)
            hello.writeString(": ok\n\n")
            context.writeAndFlush(wrapOutboundOut(.body(.byteBuffer(hello))), promise: nil)
            let phase = Int64.random(in: 0..<interval)
            scheduleEvent(context: context, after: .milliseconds(phase), interval: interval)
        case .notFound:
            var body = context.channel.allocator.buffer(capacity: 16)
            body.writeString("not found\n")
            writeWhole(context: context, body: body, contentType: "text/plain", status: .notFound)
        }
    }

    private func scheduleEvent(context: ChannelHandlerContext, after delay: TimeAmount, interval: Int64) {
        sseTick = context.eventLoop.assumeIsolated().scheduleTask(in: delay) { [self] in
            guard context.channel.isActive else { return }
            var event = context.channel.allocator.buffer(capacity: 32)
            event.writeString("data: \(monotonicNanoseconds())\n\n")
            context.writeAndFlush(wrapOutboundOut(.body(.byteBuffer(event))), promise: nil)
            scheduleEvent(context: context, after: .milliseconds(interval), interval: interval)
        }
    }

    private func writeHead(context: ChannelHandlerContext, status: HTTPResponseStatus, length: Int, contentType: String)
    {
        var headers = HTTPHeaders()
        headers.add(name: "content-type", value: contentType)
        headers.add(name: "content-length", value: String(length))
        if !keepAlive { headers.add(name: "connection", value: "close") }
        context.write(
            wrapOutboundOut(.head(HTTPResponseHead(version: .http1_1, status: status, headers: headers))),
            promise: nil
        )
    }

    private func writeWhole(
        context: ChannelHandlerContext,
        body: ByteBuffer,
        contentType: String,
        status: HTTPResponseStatus = .ok
    ) {
        writeHead(context: context, status: status, length: body.readableBytes, contentType: contentType)
        context.write(wrapOutboundOut(.body(.byteBuffer(body))), promise: nil)
        finish(context: context)
    }

    private func finish(context: ChannelHandlerContext) {
        let done = context.writeAndFlush(wrapOutboundOut(.end(nil)))
        if !keepAlive {
            done.assumeIsolated().whenComplete { _ in context.close(promise: nil) }
        }
    }

    private func pumpDownload(context: ChannelHandlerContext) {
        while streaming, context.channel.isWritable, downloadRemaining > 0 {
            let size = min(downloadRemaining, Self.chunk.readableBytes)
            downloadRemaining -= size
            context.write(wrapOutboundOut(.body(.byteBuffer(Self.chunk.getSlice(at: 0, length: size)!))), promise: nil)
        }
        if streaming, downloadRemaining == 0 {
            streaming = false
            finish(context: context)
        } else {
            context.flush()
        }
    }

    func channelWritabilityChanged(context: ChannelHandlerContext) {
        if streaming, context.channel.isWritable { pumpDownload(context: context) }
        context.fireChannelWritabilityChanged()
    }

    func channelInactive(context: ChannelHandlerContext) {
        sseTick?.cancel()
        streaming = false
        context.fireChannelInactive()
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        context.close(promise: nil)
    }
}

enum BenchBackend {
    static func run(host: String, port: Int, threads: Int) throws {
        let group = MultiThreadedEventLoopGroup(numberOfThreads: threads)
        let channel = try ServerBootstrap(group: group)
            .serverChannelOption(.backlog, value: 4096)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            .childChannelOption(.tcpOption(.tcp_nodelay), value: 1)
            .childChannelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    try channel.pipeline.syncOperations.configureHTTPServerPipeline(withErrorHandling: true)
                    try channel.pipeline.syncOperations.addHandler(BenchBackendHandler())
                }
            }
            .bind(host: host, port: port)
            .wait()
        print("ils-bench backend listening on \(channel.localAddress?.description ?? "?")")
        fflush(nil)
        try channel.closeFuture.wait()
    }
}
