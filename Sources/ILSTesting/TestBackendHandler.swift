import Crypto
import Foundation
import NIOCore
import NIOHTTP1

/// The request handling behind `TestBackend`; one instance per connection.
final class TestBackendHandler: ChannelInboundHandler, RemovableChannelHandler {
    typealias InboundIn = HTTPServerRequestPart
    typealias OutboundOut = HTTPServerResponsePart

    private enum Route {
        case none
        case upload(SHA256, Int)
        case bytes(remaining: Int, offset: Int)
        case streaming
        /// `/sse-held`: the events before the last go out on their own; the last (with this index) is held.
        case held(Int)
        case silent
        case switching(HTTPRequestHead)
    }

    private let record: TestBackend.Record
    private let held: HeldEvent
    private var route = Route.none
    private var streamTask: Scheduled<Void>?
    private var streamFinished = true
    private var context: ChannelHandlerContext?
    private var writingBytes = false
    /// A `/bytes?held` body not yet released.
    private var bytesHeld = false

    init(record: TestBackend.Record, held: HeldEvent) {
        self.record = record
        self.held = held
    }

    func handlerAdded(context: ChannelHandlerContext) { self.context = context }

    /// Breaks the handler ↔ context and handler ↔ scheduled-event cycles, so a closed connection is freed
    /// (AddressSanitizer's leak check found every connection of every test backend kept alive by them).
    func handlerRemoved(context: ChannelHandlerContext) {
        streamTask?.cancel()
        streamTask = nil
        self.context = nil
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        switch unwrapInboundIn(data) {
        case .head(let head):
            record.update {
                $0.lastHeaders = head.headers.map { ($0.name, $0.value) }
                $0.targets.append(head.uri)
                if $0.targets.count > TestBackend.Record.keptTargets { $0.targets.removeFirst() }
            }
            start(head, context: context)
        case .body(let buffer):
            if case .upload(var hash, let count) = route {
                buffer.withUnsafeReadableBytes { hash.update(bufferPointer: $0) }
                route = .upload(hash, count + buffer.readableBytes)
                record.update { $0.bytesReceived += buffer.readableBytes }
            }
        case .end:
            if case .switching(let head) = route {
                route = .none
                switchToEcho(head, context: context)
            }
            if case .upload(let hash, let count) = route {
                let hex = hash.finalize().map { String(format: "%02x", $0) }.joined()
                respond(context, status: .ok, body: "{\"bytes\":\(count),\"sha256\":\"\(hex)\"}")
                route = .none
            }
        }
    }

    func channelInactive(context: ChannelHandlerContext) {
        streamTask?.cancel()
        if !streamFinished {
            streamFinished = true
            record.update { $0.streamsDisconnected += 1 }
        }
        context.fireChannelInactive()
    }

    func channelWritabilityChanged(context: ChannelHandlerContext) {
        if context.channel.isWritable { writeMoreBytes(context) }
        context.fireChannelWritabilityChanged()
    }

    private func start(_ head: HTTPRequestHead, context: ChannelHandlerContext) {
        let (path, query) = Self.split(head.uri)
        switch path {
        case "/health":
            respond(context, status: .ok, body: "ok")
        case "/headers":
            let text = head.headers.map { "\($0.name.lowercased()): \($0.value)" }.joined(separator: "\n")
            respond(context, status: .ok, body: text)
        case "/sse", "/plain":
            let count = query["n"].flatMap(Int.init) ?? 5
            let interval = query["interval_ms"].flatMap(Int64.init) ?? 100
            let type = path == "/sse" ? "text/event-stream" : "application/octet-stream"
            startStream(
                context,
                count: count,
                interval: .milliseconds(interval),
                contentType: type,
                sse: path == "/sse"
            )
        case "/sse-held":
            let count = max(query["n"].flatMap(Int.init) ?? 3, 2)
            startStream(
                context,
                count: count - 1,
                interval: .milliseconds(10),
                contentType: "text/event-stream",
                sse: true
            )
            // `sendEvent` ends the stream after `count - 1` events; the last one waits for the test instead.
            route = .held(count - 1)
        case "/bytes":
            let size = query["size"].flatMap(Int.init) ?? 0
            var headers = HTTPHeaders()
            headers.add(name: "Content-Type", value: "application/octet-stream")
            if query["chunked"] == nil { headers.add(name: "Content-Length", value: String(size)) }
            context.write(
                wrapOutboundOut(.head(HTTPResponseHead(version: .http1_1, status: .ok, headers: headers))),
                promise: nil
            )
            route = .bytes(remaining: size, offset: 0)
            guard query["held"] != nil else {
                writeMoreBytes(context)
                return
            }
            // `&held`: the head goes now, the body once the test calls `held.release()`.
            bytesHeld = true
            context.flush()
            let loopBound = NIOLoopBound(self, eventLoop: context.eventLoop)
            let eventLoop = context.eventLoop
            held.whenReleased {
                eventLoop.execute {
                    let handler = loopBound.value
                    handler.bytesHeld = false
                    guard let context = handler.context else { return }
                    handler.writeMoreBytes(context)
                }
            }
        case "/upload":
            route = .upload(SHA256(), 0)
        case "/slow-headers":
            route = .silent
        case "/close-before-headers":
            context.close(promise: nil)
        case "/die-mid-stream":
            var headers = HTTPHeaders()
            headers.add(name: "Content-Type", value: "text/event-stream")
            context.write(
                wrapOutboundOut(.head(HTTPResponseHead(version: .http1_1, status: .ok, headers: headers))),
                promise: nil
            )
            let channel = context.channel
            context.writeAndFlush(wrapOutboundOut(.body(.byteBuffer(ByteBuffer(string: "data: first\n\n")))))
                .whenComplete { _ in channel.close(promise: nil) }
        case "/ws":
            // Switch at the request's `.end`: the decoder still delivers it after the head.
            route = .switching(head)
        default:
            respond(context, status: .notFound, body: "not found")
        }
    }

    private func startStream(
        _ context: ChannelHandlerContext,
        count: Int,
        interval: TimeAmount,
        contentType: String,
        sse: Bool
    ) {
        var headers = HTTPHeaders()
        headers.add(name: "Content-Type", value: contentType)
        headers.add(name: "Cache-Control", value: "no-cache")
        context.writeAndFlush(
            wrapOutboundOut(.head(HTTPResponseHead(version: .http1_1, status: .ok, headers: headers))),
            promise: nil
        )
        streamFinished = false
        route = .streaming
        sendEvent(context, index: 0, count: count, interval: interval, sse: sse)
    }

    private func sendEvent(_ context: ChannelHandlerContext, index: Int, count: Int, interval: TimeAmount, sse: Bool) {
        guard !streamFinished else { return }
        if index == count, case .held(let last) = route {
            let loopBound = NIOLoopBound(self, eventLoop: context.eventLoop)
            let eventLoop = context.eventLoop
            held.whenReleased {
                eventLoop.execute {
                    let handler = loopBound.value
                    guard let context = handler.context else { return }
                    handler.route = .streaming
                    handler.sendEvent(context, index: last, count: last + 1, interval: interval, sse: sse)
                }
            }
            return
        }
        guard index < count else {
            streamFinished = true
            record.update { $0.streamsCompleted += 1 }
            context.writeAndFlush(wrapOutboundOut(.end(nil)), promise: nil)
            return
        }
        let text = sse ? "event: message\ndata: {\"index\": \(index)}\n\n" : "chunk \(index)\n"
        record.update { $0.eventsSent += 1 }
        context.writeAndFlush(wrapOutboundOut(.body(.byteBuffer(ByteBuffer(string: text)))), promise: nil)
        streamTask = context.eventLoop.assumeIsolated().scheduleTask(in: interval) {
            self.sendEvent(context, index: index + 1, count: count, interval: interval, sse: sse)
        }
    }

    /// Writes `/bytes` only while the socket can take it, like any well-behaved streaming server, so a stalled
    /// reader anywhere downstream shows up here as bytes not written.
    private func writeMoreBytes(_ context: ChannelHandlerContext) {
        // A write can change writability and call back in here; the outer call carries on with the state it sees.
        guard !writingBytes, !bytesHeld, case .bytes(var remaining, var offset) = route else { return }
        writingBytes = true
        defer { writingBytes = false }
        while remaining > 0 && context.channel.isWritable {
            let size = min(remaining, 64 * 1024)
            var buffer = context.channel.allocator.buffer(capacity: size)
            buffer.writeWithUnsafeMutableBytes(minimumWritableBytes: size) { pointer in
                TestBackend.fillPattern(UnsafeMutableRawBufferPointer(rebasing: pointer[0..<size]), offset: offset)
                return size
            }
            remaining -= size
            offset += size
            record.update { $0.bytesWritten += size }
            context.writeAndFlush(wrapOutboundOut(.body(.byteBuffer(buffer))), promise: nil)
        }
        route = .bytes(remaining: remaining, offset: offset)
        if remaining == 0 {
            route = .none
            context.writeAndFlush(wrapOutboundOut(.end(nil)), promise: nil)
        }
    }

    /// Accepts a protocol switch, sends a greeting in the same flush as the 101, then echoes raw bytes.
    private func switchToEcho(_ head: HTTPRequestHead, context: ChannelHandlerContext) {
        guard head.headers["upgrade"].first?.lowercased() == "websocket" else {
            respond(context, status: .badRequest, body: "expected an upgrade")
            return
        }
        var headers = HTTPHeaders()
        headers.add(name: "Upgrade", value: "websocket")
        headers.add(name: "Connection", value: "Upgrade")
        context.write(
            wrapOutboundOut(.head(HTTPResponseHead(version: .http1_1, status: .switchingProtocols, headers: headers))),
            promise: nil
        )
        context.write(wrapOutboundOut(.end(nil)), promise: nil)
        let pipeline = context.pipeline.syncOperations
        // The response is already encoded; drop HTTP and echo whatever comes.
        if let encoder = try? pipeline.context(handlerType: HTTPResponseEncoder.self) {
            pipeline.removeHandler(context: encoder, promise: nil)
        }
        if let pipelining = try? pipeline.context(handlerType: HTTPServerPipelineHandler.self) {
            pipeline.removeHandler(context: pipelining, promise: nil)
        }
        if let validator = try? pipeline.context(handlerType: NIOHTTPResponseHeadersValidator.self) {
            pipeline.removeHandler(context: validator, promise: nil)
        }
        if let errors = try? pipeline.context(handlerType: HTTPServerProtocolErrorHandler.self) {
            pipeline.removeHandler(context: errors, promise: nil)
        }
        if let decoder = try? pipeline.context(handlerType: ByteToMessageHandler<HTTPRequestDecoder>.self) {
            pipeline.removeHandler(context: decoder, promise: nil)
        }
        try? pipeline.addHandler(EchoHandler())
        pipeline.removeHandler(self, promise: nil)
        // Sent in the same flush as the 101, so it reaches the gateway in the same read as the response head.
        context.channel.writeAndFlush(ByteBuffer(string: "hello\n"), promise: nil)
    }

    private func respond(_ context: ChannelHandlerContext, status: HTTPResponseStatus, body: String) {
        var headers = HTTPHeaders()
        headers.add(name: "Content-Type", value: "text/plain")
        headers.add(name: "Content-Length", value: String(body.utf8.count))
        context.write(
            wrapOutboundOut(.head(HTTPResponseHead(version: .http1_1, status: status, headers: headers))),
            promise: nil
        )
        context.write(wrapOutboundOut(.body(.byteBuffer(ByteBuffer(string: body)))), promise: nil)
        context.writeAndFlush(wrapOutboundOut(.end(nil)), promise: nil)
    }

    static func split(_ uri: String) -> (path: String, query: [String: String]) {
        let parts = uri.split(separator: "?", maxSplits: 1)
        var query: [String: String] = [:]
        if parts.count > 1 {
            for pair in parts[1].split(separator: "&") {
                let kv = pair.split(separator: "=", maxSplits: 1)
                query[String(kv[0])] = kv.count > 1 ? String(kv[1]) : ""
            }
        }
        return (parts.first.map(String.init) ?? "/", query)
    }
}

/// Echoes every byte back: the "upgraded protocol" of `/ws`.
final class EchoHandler: ChannelInboundHandler {
    typealias InboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        context.write(data, promise: nil)
    }

    func channelReadComplete(context: ChannelHandlerContext) {
        context.flush()
    }
}
