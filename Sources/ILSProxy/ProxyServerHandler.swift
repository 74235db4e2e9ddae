import ILSCore
import Logging
import NIOCore
import NIOHTTP1

/// The client side of the streaming proxy: takes HTTP/1.1 requests from one client connection and streams each to a
/// backend connection and its response back, part by part, with backpressure both ways.
///
/// Nothing is buffered whole: every body part read from one side is written to the other at once, and flushed at
/// the end of each read burst, whatever the content type, so Server-Sent Events and any other streamed body reach
/// the client as soon as the backend writes them. Reads from a side are held while the other side cannot take more.
final class ProxyServerHandler: ChannelDuplexHandler, RemovableChannelHandler {
    typealias InboundIn = HTTPServerRequestPart
    typealias OutboundIn = HTTPServerResponsePart
    typealias OutboundOut = HTTPServerResponsePart

    typealias Machine = ProxyConnectionMachine<BackendHandler>

    private let configuration: ProxyConfiguration
    private let pools: BackendPool
    var client: ClientContext
    let accessLog: AccessLog
    let logger: Logger
    /// Where the connection is in its lifecycle, and what each event means there; this handler does the I/O.
    var machine: Machine
    var context: ChannelHandlerContext?
    private var pool: LoopBackendPool?
    /// The connection's one timer, due at or before `machine.nextDeadline`. It is lazy: a request moves deadlines
    /// later without touching it, and when it fires early the machine finds nothing due and it is scheduled again at
    /// the next deadline. Only a deadline earlier than the scheduled one reschedules it. (Scheduling and cancelling
    /// per request cost more than the rest of a small request's bookkeeping.)
    private var timer: Scheduled<Void>?
    private var timerDue: NIODeadline?
    /// The timer closed the connection: no deadline is left to watch. A channel's close may take effect later than
    /// the call (an overlay circuit waits for the device's ACK of the answer's end), and a closing deadline that
    /// stayed due rescheduled the timer at once, again and again: a busy loop on the event loop.
    private var closeRequested = false

    /// How long a connection may take to take its last answer before it is closed anyway: a client that stops
    /// reading must not pin the connection forever.
    static let closingDeadline: TimeAmount = .seconds(30)

    init(configuration: ProxyConfiguration, pools: BackendPool, client: ClientContext, logger: Logger) {
        self.configuration = configuration
        self.pools = pools
        self.client = client
        self.logger = logger
        self.accessLog = AccessLog(logger: logger, sink: configuration.accessLog)
        self.machine = Machine(timeouts: .init(configuration, closing: Self.closingDeadline), now: .now())
    }

    func handlerAdded(context: ChannelHandlerContext) {
        self.context = context
        self.pool = pools.pool(for: context.eventLoop)
        if client.remoteAddress == nil { client.remoteAddress = context.channel.remoteAddress }
        if context.channel.isActive { started() }
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        cancelTimer()
        self.context = nil
    }

    func channelActive(context: ChannelHandlerContext) {
        if client.remoteAddress == nil { client.remoteAddress = context.channel.remoteAddress }
        started()
        context.fireChannelActive()
    }

    private func started() {
        machine.channelActive(now: now)
        updateTimer()
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        switch unwrapInboundIn(data) {
        case .head(let head):
            let action = machine.requestHead(now: now) {
                Exchange(
                    head: head,
                    rewrite: HeaderRewriter.forwardRequest(
                        head,
                        client: client,
                        fallbackHost: configuration.backend.authority
                    )
                )
            }
            if case .lease(let exchange) = action {
                leaseBackend(for: exchange)
            } else {
                perform(action)
            }
        case .body(let buffer):
            switch machine.requestBody(bytes: buffer.readableBytes, now: now) {
            case .buffer(let exchange): exchange.buffered.append(.body(.byteBuffer(buffer)))
            case .forward(let backend): backend.write(.body(.byteBuffer(buffer)))
            case .none: break
            }
        case .end(let trailers):
            switch machine.requestEnd() {
            case .buffer(let exchange): exchange.buffered.append(.end(HeaderRewriter.forwardTrailers(trailers)))
            case .forward(let backend): backend.write(.end(HeaderRewriter.forwardTrailers(trailers)))
            case .none: break
            }
        }
    }

    func channelReadComplete(context: ChannelHandlerContext) {
        perform(machine.readComplete())
        // A request body left unfinished by this burst has a deadline now.
        updateTimer()
        context.fireChannelReadComplete()
    }

    func channelWritabilityChanged(context: ChannelHandlerContext) {
        let isWritable = context.channel.isWritable
        perform(machine.clientWritabilityChanged(isWritable: isWritable, now: now))
        if !isWritable { updateTimer() }
        context.fireChannelWritabilityChanged()
    }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        if case ChannelEvent.inputClosed = event { perform(machine.clientInputClosed(now: now)) }
        context.fireUserInboundEventTriggered(event)
    }

    func channelInactive(context: ChannelHandlerContext) {
        cancelTimer()
        perform(machine.clientInactive())
        context.fireChannelInactive()
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        guard let parserError = error as? HTTPParserError else {
            // Transport errors (a reset, a TLS alert) end the connection; channelInactive does the cleanup.
            if case .closing = machine.state { return }
            logger.debug("client connection error", metadata: ["error": "\(error)"])
            context.close(promise: nil)
            return
        }
        let answer: ProxyError = parserError == .headerOverflow ? .headersTooLarge : .malformedRequest
        perform(machine.requestParseFailed(answer, now: now))
    }

    func read(context: ChannelHandlerContext) {
        if machine.read(backendWritable: backendIsWritable) { context.read() }
    }

    /// Whether the exchange's backend connection can take more; false with none.
    private var backendIsWritable: Bool {
        if case .forwarding(_, let backend) = machine.state { return backend.isWritable }
        return false
    }

    /// The time on the connection's event loop (the timer's clock: real time, or an embedded loop's own).
    private var now: NIODeadline { context?.eventLoop.now ?? .now() }

    // MARK: The timer

    /// Schedules the timer if the machine's next deadline comes before the one it is scheduled for (or none is).
    private func updateTimer() {
        guard !closeRequested, let next = machine.nextDeadline, let context else { return }
        if let timerDue, timerDue <= next { return }
        timer?.cancel()
        timerDue = next
        timer = context.eventLoop.assumeIsolated().scheduleTask(deadline: next) {
            self.timer = nil
            self.timerDue = nil
            self.timerFired()
        }
    }

    private func timerFired() {
        perform(machine.timerFired(now: now, backendWritable: backendIsWritable))
        updateTimer()
    }

    private func cancelTimer() {
        timer?.cancel()
        timer = nil
        timerDue = nil
    }

    // MARK: Actions

    /// Carries out what several events may ask for; what only one event returns is handled where it arises.
    private func perform(_ action: Machine.Action) {
        switch action {
        case .none:
            break
        case .close:
            closeRequested = true
            cancelTimer()
            context?.close(promise: nil)
        case .stalled(let exchange, let backend):
            closeRequested = true
            cancelTimer()
            if let backend { pool?.release(backend, reusable: false) }
            if let exchange { accessLog.record(exchange, client: client, outcome: "client_stalled") }
            configuration.clientStalled?()
            context?.close(promise: nil)
        case .respond(let error, let exchange, let backend):
            if let backend { pool?.release(backend, reusable: false) }
            respond(with: error, to: exchange)
            updateTimer()
        case .cut(let exchange, let outcome, let backend):
            if let backend { pool?.release(backend, reusable: false) }
            // Ending the client connection, not a clean end, is how HTTP/1.1 says the response is incomplete.
            context?.flush()
            accessLog.record(exchange, client: client, outcome: outcome)
            context?.close(promise: nil)
            updateTimer()
        case .flushBackend(let backend):
            backend.flush()
        case .setBackendReads(let backend, let allowed):
            backend.setReadsAllowed(allowed)
        case .abandon(let exchange, let backend):
            if let backend { pool?.release(backend, reusable: false) }
            accessLog.record(exchange, client: client, outcome: "client_closed")
        case .returnUnused(let backend):
            pool?.release(backend, reusable: true)
        case .lease(let exchange), .retry(let exchange):
            leaseBackend(for: exchange)
        }
    }

    private func leaseBackend(for exchange: Exchange) {
        pool?.lease { result in
            let backend = try? result.get()
            let lease = self.machine.leased(
                exchange,
                result,
                reused: (backend?.requestCount ?? 0) > 1,
                backendWritable: backend?.isWritable ?? false,
                now: self.now
            )
            switch lease {
            case .startForwarding(let exchange, let backend, let writeContinue, let resumeRead):
                self.startForwarding(exchange, on: backend, writeContinue: writeContinue, resumeRead: resumeRead)
            case .other(let action):
                self.perform(action)
            }
        }
    }

    private func startForwarding(
        _ exchange: Exchange,
        on backend: BackendHandler,
        writeContinue: Bool,
        resumeRead: Bool
    ) {
        guard let context, let forwarded = exchange.forwarded else { return }
        backend.delegate = self
        backend.setReadsAllowed(context.channel.isWritable)
        if writeContinue {
            // Expect is hop-by-hop here: the gateway promises the body will be taken, now that it has somewhere
            // to go (RFC 9110 §10.1.1).
            context.writeAndFlush(
                wrapOutboundOut(.head(HTTPResponseHead(version: exchange.requestVersion, status: .continue))),
                promise: nil
            )
        }
        backend.write(.head(forwarded.head))
        InjectedLeak.requestForwarded()
        let buffered = exchange.buffered
        exchange.buffered = []
        for part in buffered { backend.write(part) }
        backend.flush()
        updateTimer()
        if resumeRead { context.read() }
    }

    /// Answers the request with the gateway's own JSON error, then closes the connection: the request body (if any)
    /// was not read, so the connection's framing can't be trusted for another request.
    private func respond(with error: ProxyError, to exchange: Exchange?) {
        guard let context else { return }
        let body = error.jsonBody(allocator: context.channel.allocator)
        var headers = HTTPHeaders()
        headers.add(name: "Content-Type", value: "application/json")
        headers.add(name: "Content-Length", value: String(body.readableBytes))
        headers.add(name: "Connection", value: "close")
        headers.add(name: "Cache-Control", value: "no-store")
        let version = exchange?.requestVersion ?? .http1_1
        context.write(
            wrapOutboundOut(.head(HTTPResponseHead(version: version, status: error.status, headers: headers))),
            promise: nil
        )
        context.write(wrapOutboundOut(.body(.byteBuffer(body))), promise: nil)
        let channel = context.channel
        context.writeAndFlush(wrapOutboundOut(.end(nil))).whenComplete { _ in
            channel.close(promise: nil)
        }
        if let exchange {
            exchange.status = error.status
            exchange.errorCode = error.code
            exchange.bytesOut += body.readableBytes
            accessLog.record(exchange, client: client)
        } else {
            logger.info(
                "refused request",
                metadata: [
                    "status": "\(error.status.code)", "error": "\(error.code)", "client": "\(client.forwardedFor)",
                ]
            )
        }
    }
}

extension ProxyServerHandler: BackendConnectionDelegate {
    func backendReceived(_ part: HTTPClientResponsePart) {
        guard let context else { return }
        switch part {
        case .head(let head):
            switch machine.responseHead(head, now: now) {
            case .writeHead(let exchange, let closeClient):
                let clientHead = HeaderRewriter.clientResponse(
                    head,
                    requestVersion: exchange.requestVersion,
                    closeAfter: closeClient
                )
                context.write(wrapOutboundOut(.head(clientHead)), promise: nil)
            case .other(let action):
                perform(action)
            }
        case .body(let buffer):
            switch machine.responseBody(bytes: buffer.readableBytes, now: now) {
            case .writeBody: context.write(wrapOutboundOut(.body(.byteBuffer(buffer))), promise: nil)
            case .other(let action): perform(action)
            }
        case .end(let trailers):
            switch machine.responseEnd(now: now) {
            case .upgrade(let exchange, let backend, let head):
                upgrade(exchange, backend: backend, head: head)
            case .finish(let exchange, let backend, let reuseBackend, let closeClient, let resumeRead):
                // Settle the exchange before writing its last part: writing the response's end can synchronously
                // deliver the next pipelined request, or (when closing) the channel's close.
                pool?.release(backend, reusable: reuseBackend)
                if closeClient {
                    updateTimer()
                    // Close only once the last byte has left, so the response is never cut short.
                    let channel = context.channel
                    context.writeAndFlush(wrapOutboundOut(.end(trailers))).whenComplete { _ in
                        channel.close(promise: nil)
                    }
                } else {
                    // Idle from now: a timer that fired mid-stream may have found no deadline and left.
                    updateTimer()
                    // Flush now: once released, the backend connection no longer reports its read completion to us.
                    context.writeAndFlush(wrapOutboundOut(.end(trailers)), promise: nil)
                }
                // After the flush: the response's last bytes are on their way before the line is formatted (the
                // exchange is settled, so what the line says is final).
                accessLog.record(exchange, client: client)
                if resumeRead { context.read() }
            case .other(let action):
                perform(action)
            }
        }
    }

    func backendReadComplete() {
        if machine.backendReadComplete() { context?.flush() }
    }

    func backendWritabilityChanged(isWritable: Bool) {
        if isWritable, machine.backendBecameWritable() { context?.read() }
    }

    func backendClosed(error: (any Error)?) {
        let action = machine.backendClosed(invalidResponse: error is HTTPParserError, now: now)
        if case .retry(let exchange) = action {
            logger.debug("reused backend connection closed before answering; retrying once on a new connection")
            exchange.buffered = exchange.machine.request == .complete ? [.end(nil)] : []
        }
        perform(action)
    }
}
