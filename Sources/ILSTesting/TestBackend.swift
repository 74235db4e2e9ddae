import Crypto
import NIOConcurrencyHelpers
import NIOCore
import NIOHTTP1
public import NIOPosix

/// An in-process backend on 127.0.0.1 that behaves like the streaming backends the gateway fronts, and records what
/// it saw, so tests can check the gateway's effect on the backend (disconnects, headers, backpressure).
///
/// Routes: `/health`, `/headers` (echoes request headers, one `name: value` per line), `/sse?n=&interval_ms=`
/// (Server-Sent Events), `/sse-held?n=` (SSE whose last event waits for `held.release()`), `/plain?n=&interval_ms=`
/// (a streamed `application/octet-stream`), `/bytes?size=` (deterministic bytes, written only while the socket is
/// writable; `&chunked` without a length, `&held` with the body held until `held.release()`), `/upload` (answers
/// byte count and SHA-256),
/// `/slow-headers` (never answers), `/die-mid-stream`, `/close-before-headers`, `/ws` (a protocol switch, then an
/// echo that greets first).
public final class TestBackend: Sendable {
    /// What the backend observed. Read from tests on any thread.
    public final class Record: Sendable {
        struct State {
            var connectionsAccepted = 0
            var connectionsClosed = 0
            var streamsDisconnected = 0
            var streamsCompleted = 0
            var eventsSent = 0
            var bytesWritten = 0
            var bytesReceived = 0
            var lastHeaders: [(String, String)] = []
            var targets: [String] = []
        }
        /// The most request targets `targets` keeps (the oldest go first).
        static let keptTargets = 10_000
        private let state = NIOLockedValueBox(State())

        public var connectionsAccepted: Int { state.withLockedValue { $0.connectionsAccepted } }
        /// Connections that have ended (closed by either side).
        public var connectionsClosed: Int { state.withLockedValue { $0.connectionsClosed } }
        /// Streams (`/sse`, `/plain`) that ended because the client side closed before the last event.
        public var streamsDisconnected: Int { state.withLockedValue { $0.streamsDisconnected } }
        public var streamsCompleted: Int { state.withLockedValue { $0.streamsCompleted } }
        /// Events written by `/sse` and `/plain` so far, across all requests.
        public var eventsSent: Int { state.withLockedValue { $0.eventsSent } }
        /// Body bytes written by `/bytes` so far.
        public var bytesWritten: Int { state.withLockedValue { $0.bytesWritten } }
        /// Body bytes `/upload` has read so far, across all requests.
        public var bytesReceived: Int { state.withLockedValue { $0.bytesReceived } }
        public var lastHeaders: [(String, String)] { state.withLockedValue { $0.lastHeaders } }
        /// The request targets (`/health?probe=3`) the backend was sent, oldest first: the last 10,000.
        public var targets: [String] { state.withLockedValue { $0.targets } }

        func update(_ body: (inout State) -> Void) { state.withLockedValue { body(&$0) } }
    }

    public let record: Record
    /// Releases the last event of `/sse-held` streams and the bodies of `/bytes?held`.
    public let held: HeldEvent
    public let port: Int
    private let listener: any Channel
    private let children: NIOLockedValueBox<[ObjectIdentifier: any Channel]>

    private init(
        port: Int,
        record: Record,
        held: HeldEvent,
        listener: any Channel,
        children: NIOLockedValueBox<[ObjectIdentifier: any Channel]>
    ) {
        self.port = port
        self.record = record
        self.held = held
        self.listener = listener
        self.children = children
    }

    /// Starts a backend on 127.0.0.1; port 0 picks a free one.
    public static func start(port: Int = 0, group: MultiThreadedEventLoopGroup = .singleton) async throws
        -> TestBackend
    {
        let record = Record()
        let held = HeldEvent()
        let children = NIOLockedValueBox<[ObjectIdentifier: any Channel]>([:])
        let listener = try await ServerBootstrap(group: group)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            .childChannelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    record.update { $0.connectionsAccepted += 1 }
                    let key = ObjectIdentifier(channel)
                    children.withLockedValue { $0[key] = channel }
                    channel.closeFuture.whenComplete { _ in
                        _ = children.withLockedValue { $0.removeValue(forKey: key) }
                        record.update { $0.connectionsClosed += 1 }
                    }
                    try channel.pipeline.syncOperations.configureHTTPServerPipeline(withErrorHandling: true)
                    try channel.pipeline.syncOperations.addHandler(TestBackendHandler(record: record, held: held))
                }
            }
            .bind(host: "127.0.0.1", port: port).get()
        return TestBackend(
            port: listener.localAddress!.port!,
            record: record,
            held: held,
            listener: listener,
            children: children
        )
    }

    /// Stops listening and closes every connection it accepted, like a backend process that exits.
    public func stop() async {
        try? await listener.close()
        let open = children.withLockedValue { Array($0.values) }
        for channel in open { try? await channel.close() }
    }

    /// The bytes `/bytes?size=N` sends: byte i is `(i * 31 + 7) & 0xff`.
    public static func pattern(size: Int) -> [UInt8] {
        [UInt8](unsafeUninitializedCapacity: size) { buffer, initialized in
            fillPattern(UnsafeMutableRawBufferPointer(buffer), offset: 0)
            initialized = size
        }
    }

    static func fillPattern(_ buffer: UnsafeMutableRawBufferPointer, offset: Int) {
        // The pattern repeats every 256 bytes; copy one period instead of computing every byte.
        var period = [UInt8](repeating: 0, count: 256)
        for index in 0..<256 { period[index] = UInt8(truncatingIfNeeded: (offset + index) &* 31 &+ 7) }
        var position = 0
        period.withUnsafeBytes { source in
            while position < buffer.count {
                let length = min(256, buffer.count - position)
                UnsafeMutableRawBufferPointer(rebasing: buffer[position..<(position + length)])
                    .copyMemory(from: UnsafeRawBufferPointer(rebasing: source[0..<length]))
                position += length
            }
        }
    }
}
