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

    enum State {
        /// Between requests, or reading a request head.
        case idle
        /// The head arrived; waiting for a backend connection. Client reads are held.
        case waitingForBackend(Exchange)
        /// Streaming both ways.
        case forwarding(Exchange, BackendHandler)
        /// The gateway answered itself (an error) or the response ended before the request did; the connection
        /// closes once that answer is written.
        case closing
        /// Bytes now flow through a `GlueHandler` pair; this handler is leaving the pipeline.
        case upgraded
        case closed
    }

    private let configuration: ProxyConfiguration
    private let pools: BackendPool
    var client: ClientContext
    let accessLog: AccessLog
    let logger: Logger
    var state = State.idle
    var context: ChannelHandlerContext?
    private var pool: LoopBackendPool?
    /// Timers are lazy, at most one of each kind per connection: a request does not schedule and cancel timers, it
    /// moves a deadline, and a timer that fires early looks at the deadline and sleeps again. Scheduling and
    /// cancelling per request cost more than the rest of a small request's bookkeeping.
    private var idleTimer: Scheduled<Void>?
    /// When the connection went idle (no request in progress); `nil` while a request is in progress.
    private var idleSince: NIODeadline?
    private var headerTimer: Scheduled<Void>?
    private var closingTimer: Scheduled<Void>?
    private var stallTimer: Scheduled<Void>?
    /// Runs while a request body is incomplete and nothing of the response has been sent: a client that stops
    /// sending its body (slowloris on the body) is cut after the idle timeout instead of holding its client and
    /// backend connections for ever. Armed at the end of a read burst that left a body unfinished (so a request
    /// without a body never schedules it), and lazy like the others: each body part only moves `bodyProgress`.
    private var bodyTimer: Scheduled<Void>?
    private var bodyProgress = NIODeadline.uptimeNanoseconds(0)
    private var pendingRead = false
    private var backendNeedsFlush = false
    private var clientNeedsFlush = false

    init(configuration: ProxyConfiguration, pools: BackendPool, client: ClientContext, logger: Logger) {
        self.configuration = configuration
        self.pools = pools
        self.client = client
        self.logger = logger
        self.accessLog = AccessLog(logger: logger, sink: configuration.accessLog)
    }

    func handlerAdded(context: ChannelHandlerContext) {
        self.context = context
        self.pool = pools.pool(for: context.eventLoop)
        if client.remoteAddress == nil { client.remoteAddress = context.channel.remoteAddress }
        if context.channel.isActive { armIdleTimer() }
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        cancelTimers()
        self.context = nil
    }

    private func cancelTimers() {
        bodyTimer?.cancel()
        idleTimer?.cancel()
        headerTimer?.cancel()
        closingTimer?.cancel()
        stallTimer?.cancel()
    }

    func channelActive(context: ChannelHandlerContext) {
        if client.remoteAddress == nil { client.remoteAddress = context.channel.remoteAddress }
        armIdleTimer()
        context.fireChannelActive()
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        switch unwrapInboundIn(data) {
        case .head(let head): receivedHead(head)
        case .body(let buffer): receivedBody(buffer)
        case .end(let trailers): receivedEnd(trailers)
        }
    }

    func channelReadComplete(context: ChannelHandlerContext) {
        if backendNeedsFlush, case .forwarding(_, let backend) = state {
            backend.flush()
        }
        backendNeedsFlush = false
        armBodyTimerIfNeeded()
        context.fireChannelReadComplete()
    }

    func channelWritabilityChanged(context: ChannelHandlerContext) {
        if case .forwarding(_, let backend) = state {
            backend.setReadsAllowed(context.channel.isWritable)
        }
        if context.channel.isWritable {
            stallTimer?.cancel()
            stallTimer = nil
        } else if stallTimer == nil {
            let channel = context.channel
            stallTimer = context.eventLoop.scheduleTask(in: configuration.clientStallTimeout.timeAmount) {
                // Not writable since then: the client stopped reading. Closing ends the backend request too.
                channel.close(promise: nil)
            }
        }
        context.fireChannelWritabilityChanged()
    }

    func channelInactive(context: ChannelHandlerContext) {
        cancelTimers()
        switch state {
        case .forwarding(let exchange, let backend):
            // The client went away mid-exchange: close the backend request now, so a generation stops and costs
            // nothing more. The connection is not reused: its response is unfinished.
            backend.delegate = nil
            pool?.release(backend, reusable: false)
            accessLog.record(exchange, client: client, outcome: "client_closed")
        case .waitingForBackend(let exchange):
            accessLog.record(exchange, client: client, outcome: "client_closed")
        case .idle, .closing, .upgraded, .closed:
            break
        }
        state = .closed
        context.fireChannelInactive()
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        // While the last answer is being written, later garbage must not cut it short.
        if case .closing = state { return }
        if let parserError = error as? HTTPParserError {
            let answer: ProxyError = parserError == .headerOverflow ? .headersTooLarge : .malformedRequest
            switch state {
            case .idle:
                respond(with: answer, to: nil)
            case .waitingForBackend(let exchange) where !exchange.responseHeadSent:
                respond(with: answer, to: exchange)
            case .forwarding(let exchange, let backend) where !exchange.responseHeadSent:
                backend.delegate = nil
                pool?.release(backend, reusable: false)
                respond(with: answer, to: exchange)
            default:
                context.close(promise: nil)
            }
            return
        }
        // Transport errors (a reset, a TLS alert) end the connection; channelInactive does the cleanup.
        logger.debug("client connection error", metadata: ["error": "\(error)"])
        context.close(promise: nil)
    }

    func read(context: ChannelHandlerContext) {
        switch state {
        case .idle, .closing, .upgraded, .closed:
            context.read()
        case .waitingForBackend:
            pendingRead = true
        case .forwarding(_, let backend):
            if backend.isWritable {
                context.read()
            } else {
                pendingRead = true
            }
        }
    }

    private func releasePendingRead() {
        if pendingRead, let context {
            pendingRead = false
            context.read()
        }
    }

    /// How long a connection may take to take its last answer before it is closed anyway: a client that stops
    /// reading must not pin the connection forever.
    static let closingDeadline: TimeAmount = .seconds(30)

    private func enterClosing() {
        state = .closing
        idleSince = nil
        guard let context, closingTimer == nil else { return }
        let channel = context.channel
        closingTimer = context.eventLoop.scheduleTask(in: Self.closingDeadline) {
            channel.close(promise: nil)
        }
    }

    /// The time on the connection's event loop (the timers' clock: real time, or an embedded loop's own).
    private var now: NIODeadline { context?.eventLoop.now ?? .now() }

    /// The connection is idle from now: it is closed if no request starts within `--idle-timeout`.
    private func armIdleTimer() {
        let now = self.now
        idleSince = now
        scheduleIdleCheck(at: now + configuration.clientIdleTimeout.timeAmount)
    }

    private func scheduleIdleCheck(at deadline: NIODeadline) {
        guard idleTimer == nil, let context else { return }
        let channel = context.channel
        idleTimer = context.eventLoop.assumeIsolated().scheduleTask(deadline: deadline) {
            self.idleTimer = nil
            guard case .idle = self.state, let since = self.idleSince else { return }
            let due = since + self.configuration.clientIdleTimeout.timeAmount
            if due <= self.now {
                channel.close(promise: nil)
            } else {
                self.scheduleIdleCheck(at: due)
            }
        }
    }

    /// Times out the current exchange if the backend has not sent its response head by the exchange's deadline.
    private func scheduleHeaderCheck(at deadline: NIODeadline) {
        guard headerTimer == nil, let context else { return }
        headerTimer = context.eventLoop.assumeIsolated().scheduleTask(deadline: deadline) {
            self.headerTimer = nil
            guard case .forwarding(let exchange, _) = self.state, !exchange.responseHeadSent,
                let due = exchange.headerDeadline
            else { return }
            if due <= self.now {
                self.backendHeaderTimeout(exchange)
            } else {
                self.scheduleHeaderCheck(at: due)
            }
        }
    }

    private func receivedHead(_ head: HTTPRequestHead) {
        idleSince = nil
        // A pipelined request behind one that closes the connection is not answered; the close is already on its
        // way after the last response byte.
        if case .closing = state { return }
        guard case .idle = state else {
            // HTTPServerPipelineHandler serialises requests, so a second head mid-exchange is a broken pipeline.
            context?.close(promise: nil)
            return
        }
        let exchange = Exchange(head: head)
        switch HeaderRewriter.forwardRequest(head, client: client, fallbackHost: configuration.backend.authority) {
        case .failure(let error):
            respond(with: error, to: exchange)
        case .success(let forwarded):
            exchange.forwarded = forwarded
            exchange.closeAfterResponse = forwarded.clientWantsClose || forwarded.isUpgrade
            exchange.expectsContinue = head.headers["expect"].contains { $0.lowercased() == "100-continue" }
            state = .waitingForBackend(exchange)
            bodyProgress = now
            leaseBackend(for: exchange)
        }
    }

    /// Makes sure a body timer runs while the current request's body is unfinished and unanswered.
    private func armBodyTimerIfNeeded() {
        guard bodyTimer == nil, let exchange = currentExchange, !exchange.requestComplete, !exchange.responseHeadSent
        else { return }
        scheduleBodyCheck(at: bodyProgress + configuration.clientIdleTimeout.timeAmount)
    }

    private var currentExchange: Exchange? {
        switch state {
        case .waitingForBackend(let exchange), .forwarding(let exchange, _): exchange
        case .idle, .closing, .upgraded, .closed: nil
        }
    }

    private func scheduleBodyCheck(at deadline: NIODeadline) {
        guard let context else { return }
        bodyTimer = context.eventLoop.assumeIsolated().scheduleTask(deadline: deadline) {
            self.bodyTimer = nil
            self.checkBody()
        }
    }

    private func checkBody() {
        guard let exchange = currentExchange, !exchange.requestComplete, !exchange.responseHeadSent else { return }
        let due = bodyProgress + configuration.clientIdleTimeout.timeAmount
        if case .forwarding(_, let backend) = state, due <= now {
            if pendingRead || !backend.isWritable {
                // Held by backpressure from the backend, not stalled by the client.
                bodyProgress = now
                armBodyTimerIfNeeded()
                return
            }
            backend.delegate = nil
            pool?.release(backend, reusable: false)
            respond(with: .requestBodyTimeout, to: exchange)
            return
        }
        if case .waitingForBackend = state {
            // Client reads are held while no backend connection is ready: the silence is ours, not the client's.
            bodyProgress = max(bodyProgress, now)
        }
        scheduleBodyCheck(at: max(due, bodyProgress + configuration.clientIdleTimeout.timeAmount))
    }

    private func receivedBody(_ buffer: ByteBuffer) {
        switch state {
        case .waitingForBackend(let exchange):
            exchange.bytesIn += buffer.readableBytes
            exchange.buffered.append(.body(.byteBuffer(buffer)))
        case .forwarding(let exchange, let backend):
            exchange.bytesIn += buffer.readableBytes
            backend.write(.body(.byteBuffer(buffer)))
            backendNeedsFlush = true
            bodyProgress = now
        case .idle, .closing, .upgraded, .closed:
            break
        }
    }

    private func receivedEnd(_ trailers: HTTPHeaders?) {
        switch state {
        case .waitingForBackend(let exchange):
            exchange.requestComplete = true
            exchange.buffered.append(.end(HeaderRewriter.forwardTrailers(trailers)))
        case .forwarding(let exchange, let backend):
            exchange.requestComplete = true
            backend.write(.end(HeaderRewriter.forwardTrailers(trailers)))
            backendNeedsFlush = true
            if exchange.responseComplete { finish(exchange, backend: backend) }
        case .idle, .closing, .upgraded, .closed:
            break
        }
    }

    private func leaseBackend(for exchange: Exchange) {
        exchange.attempts += 1
        pool?.lease { result in
            guard case .waitingForBackend(let current) = self.state, current === exchange else {
                // The client left (or the exchange ended) while we waited: hand the connection straight back.
                if case .success(let backend) = result { self.pool?.release(backend, reusable: true) }
                return
            }
            switch result {
            case .failure(let error):
                self.respond(with: error, to: exchange)
            case .success(let backend):
                self.startForwarding(exchange, on: backend)
            }
        }
    }

    private func startForwarding(_ exchange: Exchange, on backend: BackendHandler) {
        guard let context, let forwarded = exchange.forwarded else { return }
        backend.delegate = self
        backend.setReadsAllowed(context.channel.isWritable)
        state = .forwarding(exchange, backend)
        exchange.reusedConnection = backend.requestCount > 1
        if exchange.expectsContinue {
            // Expect is hop-by-hop here: the gateway promises the body will be taken, now that it has somewhere
            // to go (RFC 9110 §10.1.1).
            exchange.expectsContinue = false
            context.writeAndFlush(
                wrapOutboundOut(.head(HTTPResponseHead(version: exchange.requestVersion, status: .continue))),
                promise: nil
            )
        }
        backend.write(.head(forwarded.head))
        let buffered = exchange.buffered
        exchange.buffered = []
        for part in buffered { backend.write(part) }
        backend.flush()
        let deadline = now + configuration.backendHeaderTimeout.timeAmount
        exchange.headerDeadline = deadline
        scheduleHeaderCheck(at: deadline)
        if backend.isWritable { releasePendingRead() }
    }

    private func backendHeaderTimeout(_ exchange: Exchange) {
        guard case .forwarding(let current, let backend) = state, current === exchange, !exchange.responseHeadSent
        else { return }
        backend.delegate = nil
        pool?.release(backend, reusable: false)
        respond(with: .backendTimeout, to: exchange)
    }

    /// The exchange is over on both sides: log it, recycle the backend connection, and wait for the next request or
    /// close, as the client asked.
    private func finish(_ exchange: Exchange, backend: BackendHandler) {
        pool?.release(backend, reusable: exchange.backendKeepAlive && !(exchange.forwarded?.isUpgrade ?? false))
        accessLog.record(exchange, client: client)
        if exchange.closeAfterResponse {
            // The response's last write carries the close (see `backendReceived(.end)`).
            enterClosing()
        } else {
            state = .idle
            armIdleTimer()
            releasePendingRead()
        }
    }

    /// Answers the request with the gateway's own JSON error, then closes the connection: the request body (if any)
    /// was not read, so the connection's framing can't be trusted for another request.
    private func respond(with error: ProxyError, to exchange: Exchange?) {
        guard let context else { return }
        if let exchange, exchange.responseHeadSent {
            // Too late for a status: cutting the connection is how HTTP/1.1 says the response is incomplete.
            accessLog.record(exchange, client: client, outcome: error.code)
            enterClosing()
            context.close(promise: nil)
            return
        }
        let body = error.jsonBody(allocator: context.channel.allocator)
        var headers = HTTPHeaders()
        headers.add(name: "Content-Type", value: "application/json")
        headers.add(name: "Content-Length", value: String(body.readableBytes))
        headers.add(name: "Connection", value: "close")
        headers.add(name: "Cache-Control", value: "no-store")
        let version = exchange?.requestVersion ?? .http1_1
        enterClosing()
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
        guard case .forwarding(let exchange, let backend) = state, let context else { return }
        switch part {
        case .head(let head):
            exchange.backendKeepAlive = head.isKeepAlive
            if exchange.forwarded?.isUpgrade == true, head.status == .switchingProtocols {
                // Switch at the 101's `.end`: the response decoder still delivers that part after the head, and it
                // must not reach the byte-level glue.
                exchange.switchingProtocols = head
                return
            }
            if head.status == .switchingProtocols {
                // A 101 to a request that did not ask to switch: the connection's framing is gone.
                exchange.backendKeepAlive = false
                backend.delegate = nil
                pool?.release(backend, reusable: false)
                respond(with: .backendInvalidResponse, to: exchange)
                return
            }
            if exchange.requestVersion.minor == 0 { exchange.closeAfterResponse = true }
            let clientHead = HeaderRewriter.clientResponse(
                head,
                requestVersion: exchange.requestVersion,
                closeAfter: exchange.closeAfterResponse
            )
            exchange.status = head.status
            exchange.responseHeadSent = true
            context.write(wrapOutboundOut(.head(clientHead)), promise: nil)
            clientNeedsFlush = true
        case .body(let buffer):
            exchange.bytesOut += buffer.readableBytes
            context.write(wrapOutboundOut(.body(.byteBuffer(buffer))), promise: nil)
            clientNeedsFlush = true
        case .end(let trailers):
            if let switchHead = exchange.switchingProtocols {
                upgrade(exchange, backend: backend, head: switchHead)
                return
            }
            exchange.responseComplete = true
            if !exchange.requestComplete {
                // The backend answered before the request body ended (e.g. a 413): the backend connection's framing
                // is now unknown and the client still sends a body nobody reads. End both.
                exchange.backendKeepAlive = false
                exchange.closeAfterResponse = true
            }
            // Settle the exchange before writing its last part: writing the response's end can synchronously
            // deliver the next pipelined request, or (when closing) the channel's close.
            let closeAfter = exchange.closeAfterResponse
            finish(exchange, backend: backend)
            clientNeedsFlush = false
            if closeAfter {
                // Close only once the last byte has left, so the response is never cut short.
                let channel = context.channel
                context.writeAndFlush(wrapOutboundOut(.end(trailers))).whenComplete { _ in
                    channel.close(promise: nil)
                }
            } else {
                // Flush now: once released, the backend connection no longer reports its read completion to us.
                context.writeAndFlush(wrapOutboundOut(.end(trailers)), promise: nil)
            }
        }
    }

    func backendReadComplete() {
        if clientNeedsFlush {
            clientNeedsFlush = false
            context?.flush()
        }
    }

    func backendWritabilityChanged(isWritable: Bool) {
        if isWritable { releasePendingRead() }
    }

    func backendClosed(error: (any Error)?) {
        guard case .forwarding(let exchange, _) = state else { return }
        if exchange.isRetryable, !(error is HTTPParserError) {
            logger.debug("reused backend connection closed before answering; retrying once on a new connection")
            exchange.buffered = exchange.requestComplete ? [.end(nil)] : []
            state = .waitingForBackend(exchange)
            leaseBackend(for: exchange)
            return
        }
        if exchange.responseHeadSent {
            // The backend died mid-stream. Ending the client connection (not a clean chunked end) tells the client
            // the response is truncated; it must never hang waiting for more.
            context?.flush()
            accessLog.record(exchange, client: client, outcome: "backend_closed_mid_response")
            enterClosing()
            context?.close(promise: nil)
            return
        }
        respond(with: error is HTTPParserError ? .backendInvalidResponse : .backendReset, to: exchange)
    }
}
