import Foundation
import ILSCore
import ILSDial
import ILSIdentity
import NIOCore
import NIOHTTP1
import NIOPosix

/// The app's own path under load: HTTP/1.1 requests dialled in process through `OverlayDialer`, as an app that links
/// ILSClient does (no tunnel, two relays: the controller and the gateway), or over plain TCP to any other path, so
/// "added" latency is computed against this same client's direct figure and the client's own cost cancels out.
///
/// Every measurement runs its requests on the connection's event loop, one after another, with no task hops: the
/// client adds as little as it can to what it measures.
enum LoadClient {
    enum Target: Sendable, CustomStringConvertible {
        case tcp(port: Int)
        case overlay(dialer: OverlayDialer, service: String)

        var description: String {
            switch self {
            case .tcp(let port): "tcp:\(port)"
            case .overlay(_, let service): "overlay:\(service)"
            }
        }

        /// `tcp:PORT` or `overlay:IDENTITY-FILE:SERVICE`.
        static func parse(_ text: String, group: any EventLoopGroup) throws -> Target {
            let parts = text.split(separator: ":", maxSplits: 2).map(String.init)
            switch (parts.first, parts.count) {
            case ("tcp", 2):
                guard let port = Int(parts[1]), (1...65535).contains(port) else {
                    throw ILSError(.invalidArgument, "'\(text)': tcp:PORT needs a port from 1 to 65535")
                }
                return .tcp(port: port)
            case ("overlay", 3):
                let identity = try IdentityFileIO.read(parts[1])
                let dialer = try OverlayDialer(identity: identity, eventLoop: group.next())
                return .overlay(dialer: dialer, service: parts[2])
            default:
                throw ILSError(.invalidArgument, "'\(text)' is neither tcp:PORT nor overlay:IDENTITY-FILE:SERVICE")
            }
        }

        /// The loop a request sequence runs on: its connections' own. Every circuit of a dialer is on the dialer's
        /// loop, as in an app.
        func loop(_ group: any EventLoopGroup) -> any EventLoop {
            switch self {
            case .tcp: group.next()
            case .overlay(let dialer, _): dialer.eventLoop
            }
        }

        /// A connection (TCP) or a circuit (overlay) that carries the request's plaintext bytes.
        func connect(on loop: any EventLoop) -> EventLoopFuture<any Channel> {
            switch self {
            case .tcp(let port):
                ClientBootstrap(group: loop)
                    .channelOption(.tcpOption(.tcp_nodelay), value: 1)
                    .connect(host: "127.0.0.1", port: port)
            case .overlay(let dialer, let service):
                dialer.dial(service: service)
            }
        }
    }

    enum Mode: String, CaseIterable {
        /// Sequential keep-alive requests for `--path`, `--gap-ms` apart, each timed from its first byte sent to
        /// its last byte received.
        case latency
        /// `--connections` connections, each sending its next request as soon as the last one ended, for `--seconds`.
        case rps
        /// One `GET /bytes/N`, timed from the request to the last byte.
        case download
        /// One `PUT /upload` of N bytes (no `Expect: 100-continue`), timed from the request to the response's end.
        case upload
    }

    struct Options: Sendable {
        var path = "/small"
        var count = 3000
        var warmup = 200
        var gap = TimeAmount.microseconds(500)
        var connections = 32
        var seconds = 8.0
        var bytes = 512 << 20
        /// A new connection (a new circuit, with its own end-to-end handshake) for every request, as
        /// `OverlayClient.stream` and URLSession do; otherwise one keep-alive connection.
        var connectionPerRequest = false
    }

    struct Result: Encodable {
        var target: String
        var mode: String
        var connectionPerRequest: Bool
        var requests: Int?
        var p50Microseconds: Double?
        var p99Microseconds: Double?
        var requestsPerSecond: Double?
        var bytes: Int?
        var mibPerSecond: Double?
        var seconds: Double
    }

    static func run(target: Target, mode: Mode, options: Options, group: any EventLoopGroup) throws -> Result {
        let loop = target.loop(group)
        let start = NIODeadline.now()
        var result = Result(
            target: target.description,
            mode: mode.rawValue,
            connectionPerRequest: options.connectionPerRequest,
            seconds: 0
        )
        switch mode {
        case .latency:
            var samples = try Sequence.run(target, loop: loop, options: options, kind: .latency).wait()
            samples.sort()
            result.requests = samples.count
            result.p50Microseconds = percentile(samples, 0.50)
            result.p99Microseconds = percentile(samples, 0.99)
        case .rps:
            let deadline = NIODeadline.now() + .nanoseconds(Int64(options.seconds * 1e9))
            let counts = try EventLoopFuture.whenAllSucceed(
                (0..<options.connections).map { _ in
                    Sequence.run(target, loop: target.loop(group), options: options, kind: .until(deadline))
                },
                on: loop
            ).wait()
            let requests = counts.reduce(0) { $0 + $1.count }
            result.requests = requests
            result.requestsPerSecond = Double(requests) / seconds(since: start)
        case .download, .upload:
            let transfer: Sequence.Kind = mode == .download ? .download(options.bytes) : .upload(options.bytes)
            _ = try Sequence.run(target, loop: loop, options: options, kind: transfer).wait()
            result.bytes = options.bytes
            result.mibPerSecond = Double(options.bytes) / 1_048_576 / seconds(since: start)
        }
        result.seconds = seconds(since: start)
        return result
    }

    static func percentile(_ sorted: [Double], _ fraction: Double) -> Double {
        sorted[min(sorted.count - 1, Int((Double(sorted.count) * fraction).rounded(.down)))]
    }

    private static func seconds(since start: NIODeadline) -> Double {
        Double((NIODeadline.now() - start).nanoseconds) / 1e9
    }

    /// Requests sent one after another on one connection (or on a new one each time), driven from the event loop.
    final class Sequence {
        enum Kind: Sendable {
            case latency
            case until(NIODeadline)
            case download(Int)
            case upload(Int)
        }

        private let target: Target
        private let loop: any EventLoop
        private let options: Options
        private let kind: Kind
        private let done: EventLoopPromise<[Double]>
        /// Microseconds per timed request (latency); one entry per request otherwise, so the count is the result.
        private var samples: [Double] = []
        private var sent = 0
        /// The keep-alive connection and its response counter.
        private var channel: (any Channel, ResponseCounter)?

        private init(target: Target, loop: any EventLoop, options: Options, kind: Kind) {
            self.target = target
            self.loop = loop
            self.options = options
            self.kind = kind
            self.done = loop.makePromise()
        }

        static func run(_ target: Target, loop: any EventLoop, options: Options, kind: Kind)
            -> EventLoopFuture<[Double]>
        {
            // Made on its loop, and never leaves it.
            loop.flatSubmit {
                let sequence = Sequence(target: target, loop: loop, options: options, kind: kind)
                sequence.next()
                return sequence.done.futureResult
            }
        }

        private var head: HTTPRequestHead {
            var head: HTTPRequestHead
            switch kind {
            case .latency, .until:
                head = HTTPRequestHead(version: .http1_1, method: .GET, uri: options.path)
            case .download(let bytes):
                head = HTTPRequestHead(version: .http1_1, method: .GET, uri: "/bytes/\(bytes)")
            case .upload(let bytes):
                head = HTTPRequestHead(version: .http1_1, method: .PUT, uri: "/upload")
                head.headers.add(name: "Content-Length", value: String(bytes))
            }
            head.headers.add(name: "Host", value: "bench")
            return head
        }

        /// Starts the next request, or ends the sequence.
        private func next() {
            switch kind {
            case .latency:
                guard sent < options.warmup + options.count else { return finish() }
            case .until(let deadline):
                guard NIODeadline.now() < deadline else { return finish() }
            case .download, .upload:
                guard sent == 0 else { return finish() }
            }
            sent += 1
            if let (channel, counter) = channel, !options.connectionPerRequest {
                send(on: channel, counter: counter, startedAt: .now())
                return
            }
            let startedAt = NIODeadline.now()
            target.connect(on: loop).hop(to: loop).assumeIsolated().flatMapThrowing { channel in
                // The connection's handlers are added on its own loop, which is this sequence's.
                let counter = ResponseCounter()
                try channel.pipeline.syncOperations.addHTTPClientHandlers(leftOverBytesStrategy: .fireError)
                try channel.pipeline.syncOperations.addHandler(counter)
                return (channel, counter)
            }.whenComplete { result in
                switch result {
                case .failure(let error): self.fail(error)
                case .success(let (channel, counter)):
                    self.channel = (channel, counter)
                    self.send(on: channel, counter: counter, startedAt: startedAt)
                }
            }
        }

        private func send(on channel: any Channel, counter: ResponseCounter, startedAt: NIODeadline) {
            let response = loop.makePromise(of: Int.self)
            counter.expect(response)
            channel.write(HTTPClientRequestPart.head(head), promise: nil)
            if case .upload(let bytes) = kind {
                Uploader(channel: channel, remaining: bytes).start()
            } else {
                channel.writeAndFlush(HTTPClientRequestPart.end(nil), promise: nil)
            }
            response.futureResult.assumeIsolated().whenComplete { result in
                switch result {
                case .failure(let error):
                    self.fail(error)
                case .success(let bodyBytes):
                    if case .download(let bytes) = self.kind, bodyBytes != bytes {
                        return self.fail(ILSError(.unavailable, "download returned \(bodyBytes) of \(bytes) bytes"))
                    }
                    let elapsed = Double((NIODeadline.now() - startedAt).nanoseconds) / 1000
                    if case .latency = self.kind, self.sent <= self.options.warmup {
                        // Warm-up: not counted.
                    } else {
                        self.samples.append(elapsed)
                    }
                    if self.options.connectionPerRequest {
                        self.channel = nil
                        channel.close(promise: nil)
                    }
                    if case .latency = self.kind, self.options.gap > .zero {
                        self.loop.assumeIsolated().scheduleTask(in: self.options.gap) { self.next() }
                    } else {
                        self.next()
                    }
                }
            }
        }

        private func finish() {
            channel?.0.close(promise: nil)
            done.succeed(samples)
        }

        private func fail(_ error: any Error) {
            channel?.0.close(promise: nil)
            done.fail(error)
        }
    }

    /// Counts each response's body bytes; completes the promise of the request in flight at the response's end
    /// with the count, and fails it on a status other than 200 or a connection that ends first.
    final class ResponseCounter: ChannelInboundHandler {
        typealias InboundIn = HTTPClientResponsePart
        private var promise: EventLoopPromise<Int>?
        private var bytes = 0

        func expect(_ promise: EventLoopPromise<Int>) {
            self.promise = promise
            bytes = 0
        }

        func channelRead(context: ChannelHandlerContext, data: NIOAny) {
            switch unwrapInboundIn(data) {
            case .head(let head):
                if head.status != .ok {
                    fail(ILSError(.unavailable, "the path answered \(head.status.code)"))
                    context.close(promise: nil)
                }
            case .body(let buffer):
                bytes += buffer.readableBytes
            case .end:
                let promise = self.promise
                self.promise = nil
                promise?.succeed(bytes)
            }
        }

        func channelInactive(context: ChannelHandlerContext) {
            fail(ILSError(.unavailable, "the connection closed before the response ended"))
            context.fireChannelInactive()
        }

        func errorCaught(context: ChannelHandlerContext, error: any Error) {
            fail(error)
            context.close(promise: nil)
        }

        private func fail(_ error: any Error) {
            let promise = self.promise
            self.promise = nil
            promise?.fail(error)
        }
    }

    /// Writes an upload's body in 64 KiB chunks, as fast as the path takes them (waiting while it is not writable).
    final class Uploader {
        private let channel: any Channel
        private var remaining: Int
        private let chunk: ByteBuffer

        init(channel: any Channel, remaining: Int) {
            self.channel = channel
            self.remaining = remaining
            self.chunk = ByteBuffer(repeating: 0x61, count: 64 * 1024)
        }

        func start() {
            while remaining > 0 {
                let size = min(remaining, chunk.readableBytes)
                remaining -= size
                let part = HTTPClientRequestPart.body(.byteBuffer(chunk.getSlice(at: 0, length: size)!))
                if !channel.isWritable {
                    // Wait for this write to leave before queueing more: the path sets the pace.
                    channel.writeAndFlush(part).assumeIsolated().whenSuccess { self.start() }
                    return
                }
                channel.write(part, promise: nil)
            }
            channel.writeAndFlush(HTTPClientRequestPart.end(nil), promise: nil)
        }
    }
}
