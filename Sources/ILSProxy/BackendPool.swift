import ILSCore
import ILSSplice
import NIOConcurrencyHelpers
public import NIOCore
import NIOHTTP1
import NIOPosix

/// The bounded pool of keep-alive HTTP/1.1 connections to the backend, one sub-pool per event loop.
///
/// A request is always served by a backend connection on its client's event loop, so the two channels of an
/// exchange never hop threads to pass a chunk (the "pair the two channels on one event loop" rule of the data path).
/// The connection limit is split evenly between the loops.
public final class BackendPool: Sendable {
    /// Opens a connection to the backend on `eventLoop` and sets up its pipeline with `initialize`. TCP by default;
    /// the fuzz targets connect to an in-process backend instead.
    package typealias Connector =
        @Sendable (
            _ eventLoop: any EventLoop,
            _ configuration: ProxyConfiguration,
            _ initialize: @escaping @Sendable (any Channel) -> EventLoopFuture<Void>
        ) -> EventLoopFuture<any Channel>

    private let configuration: ProxyConfiguration
    private let loopPools: NIOLockedValueBox<[ObjectIdentifier: NIOLoopBound<LoopBackendPool>]>
    private let perLoopLimit: Int
    private let connector: Connector
    private let heldReadCount = NIOLockedValueBox(0)

    /// Backend connections whose reads are held now because their client cannot take more (tests: a client that
    /// stopped reading has stopped the gateway reading from the backend, so nothing more comes off that socket).
    package var heldReads: Int { heldReadCount.withLockedValue { $0 } }

    public convenience init(configuration: ProxyConfiguration, loopCount: Int = System.coreCount) {
        self.init(configuration: configuration, loopCount: loopCount) { eventLoop, configuration, initialize in
            LoopBackendPool.connectTCP(on: eventLoop, configuration: configuration, initialize: initialize)
        }
    }

    package init(configuration: ProxyConfiguration, loopCount: Int, connector: @escaping Connector) {
        self.configuration = configuration
        self.loopPools = NIOLockedValueBox([:])
        let loops = max(1, loopCount)
        self.perLoopLimit = max(1, (configuration.backendMaxConnections + loops - 1) / loops)
        self.connector = connector
    }

    /// The sub-pool of `eventLoop`. Call on that event loop; keep the result for the life of the connection.
    func pool(for eventLoop: any EventLoop) -> LoopBackendPool {
        eventLoop.preconditionInEventLoop()
        let key = ObjectIdentifier(eventLoop as AnyObject)
        return loopPools.withLockedValue { pools in
            if let existing = pools[key] { return existing.value }
            let created = LoopBackendPool(
                eventLoop: eventLoop,
                configuration: configuration,
                limit: perLoopLimit,
                connector: connector,
                heldReads: heldReadCount
            )
            pools[key] = NIOLoopBound(created, eventLoop: eventLoop)
            return created
        }
    }
}

/// The connections of one event loop. Confined to that loop; never shared.
final class LoopBackendPool {
    typealias LeaseCallback = (Result<BackendHandler, ProxyError>) -> Void

    private struct Waiter {
        let id: Int
        let callback: LeaseCallback
        let timeout: Scheduled<Void>
    }

    private let eventLoop: any EventLoop
    private let configuration: ProxyConfiguration
    private let limit: Int
    /// Idle connections, oldest first; each closes `backendIdleTimeout` after it went idle. One sweep timer serves
    /// them all, so a request that takes and returns a connection schedules nothing.
    private var idle: [(connection: BackendHandler, since: NIODeadline)] = []
    private var sweep: Scheduled<Void>?
    private var waiters = CircularBuffer<Waiter>()
    private var nextWaiterID = 0
    /// Connections open or being opened; never above `limit`.
    private(set) var openCount = 0

    var idleCount: Int { idle.count }

    private let connector: BackendPool.Connector
    private let heldReads: NIOLockedValueBox<Int>

    init(
        eventLoop: any EventLoop,
        configuration: ProxyConfiguration,
        limit: Int,
        connector: @escaping BackendPool.Connector,
        heldReads: NIOLockedValueBox<Int>
    ) {
        self.eventLoop = eventLoop
        self.configuration = configuration
        self.limit = limit
        self.connector = connector
        self.heldReads = heldReads
    }

    /// Hands a connection to `callback`: the most recently used idle one, a new one, or (at the limit) the next one
    /// released, failing with `backend_busy` after the pool wait timeout.
    func lease(_ callback: @escaping LeaseCallback) {
        while let (connection, _) = idle.popLast() {
            if connection.isActive {
                connection.requestCount += 1
                callback(.success(connection))
                return
            }
        }
        if openCount < limit {
            connect(callback)
            return
        }
        let id = nextWaiterID
        nextWaiterID += 1
        let timeout = eventLoop.assumeIsolated().scheduleTask(in: configuration.backendPoolWaitTimeout.timeAmount) {
            guard let index = self.waiters.firstIndex(where: { $0.id == id }) else { return }
            let waiter = self.waiters.remove(at: index)
            waiter.callback(.failure(.backendBusy))
        }
        waiters.append(Waiter(id: id, callback: callback, timeout: timeout))
    }

    /// Returns a connection after an exchange. Only a connection whose last response was complete and that both
    /// sides want to keep alive may be reused; anything else is closed.
    func release(_ connection: BackendHandler, reusable: Bool) {
        connection.delegate = nil
        connection.setReadsAllowed(true)
        guard reusable, connection.isActive else {
            connection.close()
            return
        }
        if let waiter = waiters.popFirst() {
            waiter.timeout.cancel()
            connection.requestCount += 1
            waiter.callback(.success(connection))
            return
        }
        let now = eventLoop.now
        idle.append((connection, now))
        scheduleSweep(at: now + configuration.backendIdleTimeout.timeAmount)
    }

    /// Closes the connections idle for `backendIdleTimeout` (shorter than the backend's own keep-alive, so the
    /// gateway closes first), then sleeps until the next one is due.
    private func scheduleSweep(at deadline: NIODeadline) {
        guard sweep == nil else { return }
        sweep = eventLoop.assumeIsolated().scheduleTask(deadline: deadline) {
            self.sweep = nil
            let timeout = self.configuration.backendIdleTimeout.timeAmount
            let now = self.eventLoop.now
            let expired = self.idle.prefix { $0.since + timeout <= now }
            self.idle.removeFirst(expired.count)
            for (connection, _) in expired { connection.close() }
            if let oldest = self.idle.first { self.scheduleSweep(at: oldest.since + timeout) }
        }
    }

    /// Reads per event-loop turn on a backend connection. NIO keeps one receive buffer (up to 64 KiB) per read of a
    /// turn for as long as the channel lives, and everything read in one turn is flushed to the client as one
    /// write, which the client's TLS handler then keeps as its ciphertext buffer: one read per turn bounds both, so
    /// a pooled keep-alive connection idles at about 500 KiB instead of 700 after large bodies (docs/soak.md).
    /// Throughput, in alternating benchmark runs: HTTP mode equal within the runs' noise (one set of three had TLS
    /// download 12 % lower, plain and uploads higher).
    static let backendMessagesPerRead: UInt = 1

    /// The default `BackendPool.Connector`: a TCP connection to the configured backend.
    static func connectTCP(
        on eventLoop: any EventLoop,
        configuration: ProxyConfiguration,
        initialize: @escaping @Sendable (any Channel) -> EventLoopFuture<Void>
    ) -> EventLoopFuture<any Channel> {
        ClientBootstrap(group: eventLoop)
            .connectTimeout(configuration.backendConnectTimeout.timeAmount)
            .channelOption(.tcpOption(.tcp_nodelay), value: 1)
            .channelOption(.maxMessagesPerRead, value: Self.backendMessagesPerRead)
            .channelOption(.writeBufferWaterMark, value: WriteBuffers.localConnection)
            .channelInitializer(initialize)
            .connect(host: configuration.backend.host, port: configuration.backend.port)
    }

    /// The pipeline of every backend connection: the HTTP/1.1 client codec and `BackendHandler`.
    @Sendable static func initializeBackendChannel(_ channel: any Channel) -> EventLoopFuture<Void> {
        channel.eventLoop.makeCompletedFuture {
            // Bytes that follow a 101 response belong to the upgraded protocol and must reach the client.
            // Request heads are the client's, already parsed strictly, plus values the gateway sets itself
            // (see `ProxyCore.configureClientPipeline`): validating them again on the way out is waste.
            try channel.pipeline.syncOperations.addHTTPClientHandlers(
                leftOverBytesStrategy: .forwardBytes,
                enableOutboundHeaderValidation: false
            )
            try channel.pipeline.syncOperations.addHandler(BackendHandler())
        }
    }

    private func connect(_ callback: @escaping LeaseCallback) {
        openCount += 1
        connector(eventLoop, configuration, Self.initializeBackendChannel).assumeIsolated().whenComplete { result in
            switch result {
            case .success(let channel):
                guard channel.isActive,
                    let handler = try? channel.pipeline.syncOperations.handler(type: BackendHandler.self)
                else {
                    channel.close(promise: nil)
                    self.connectionClosed(nil)
                    callback(.failure(.backendUnreachable))
                    return
                }
                // The close future, not the handler, does the accounting: after a WebSocket upgrade the handler
                // leaves the pipeline but the connection still counts until it closes.
                channel.closeFuture.assumeIsolated().whenComplete { _ in self.connectionClosed(handler) }
                handler.requestCount = 1
                handler.heldReads = self.heldReads
                callback(.success(handler))
            case .failure:
                self.openCount -= 1
                callback(.failure(.backendUnreachable))
                self.serveWaiterIfPossible()
            }
        }
    }

    private func connectionClosed(_ connection: BackendHandler?) {
        openCount -= 1
        if let connection, let index = idle.firstIndex(where: { $0.connection === connection }) {
            idle.remove(at: index)
        }
        serveWaiterIfPossible()
    }

    private func serveWaiterIfPossible() {
        guard openCount < limit, let waiter = waiters.popFirst() else { return }
        waiter.timeout.cancel()
        connect(waiter.callback)
    }
}

extension TimeSpan {
    var timeAmount: TimeAmount { .nanoseconds(nanoseconds) }
}
