import ILSSplice
public import NIOCore
public import NIOHTTP2

/// HTTP/2 settings shared by every overlay connection.
///
/// Every peer on these connections is authenticated (mutual TLS with an enrolled identity), and a circuit's normal
/// abortive end is a RST_STREAM: a device whose client hangs up on 300 streams in a minute is not attacking anyone.
/// swift-nio-http2's defaults against rapid-reset floods (200 resets or stream errors per 30 s, 200 stream errors
/// per connection lifetime) would tear down a busy device's or gateway's whole connection, so the overlay raises them
/// to bounds that still stop a runaway peer (`resetsPerWindow` in `window`, about 2,000 a second).
public enum FabricSettings {
    public static let resetsPerWindow = 20_000
    public static let window: TimeAmount = .seconds(10)
    /// Stream errors tolerated over a connection's life (NIO's "glitches"); connections live for months.
    public static let maximumGlitches = 1_000_000

    /// The streams a peer may open at once on a connection, unless the caller says fewer (a controller tells each
    /// device its identity's circuit cap).
    public static let maximumConcurrentStreams = 16384

    public static var connection: NIOHTTP2Handler.ConnectionConfiguration { connection(maxConcurrentStreams: nil) }

    public static func connection(maxConcurrentStreams: Int?) -> NIOHTTP2Handler.ConnectionConfiguration {
        var configuration = NIOHTTP2Handler.ConnectionConfiguration()
        configuration.initialSettings = [
            HTTP2Setting(
                parameter: .maxConcurrentStreams,
                value: min(maxConcurrentStreams ?? maximumConcurrentStreams, maximumConcurrentStreams)
            ),
            HTTP2Setting(parameter: .initialWindowSize, value: FabricProtocol.streamWindow),
            HTTP2Setting(parameter: .maxHeaderListSize, value: 16384),
            // A whole end-to-end record (64 KiB + 21 bytes) fits one DATA frame instead of five.
            HTTP2Setting(parameter: .maxFrameSize, value: FabricProtocol.maximumFrameSize),
        ]
        // The connection window bounds all circuits of a connection together; at the HTTP/2 default (64 KiB) one
        // bulk transfer would starve every other circuit and cap throughput. Each circuit stays bounded by its own
        // stream window.
        configuration.targetWindowSize = FabricProtocol.connectionWindow
        configuration.maximumConnectionGlitches = maximumGlitches
        // A frame may still arrive for a stream this side has just reset; NIO forgives that only for the last 32 reset
        // streams and otherwise ends the whole connection. 400 clients hanging up at once must not do that.
        configuration.maximumRecentlyResetStreams = 16384
        return configuration
    }

    public static var stream: NIOHTTP2Handler.StreamConfiguration {
        var configuration = NIOHTTP2Handler.StreamConfiguration()
        configuration.targetWindowSize = FabricProtocol.streamWindow
        configuration.streamResetFrameRateLimit.maximumCount = resetsPerWindow
        configuration.streamResetFrameRateLimit.windowLength = window
        configuration.streamErrorRateLimit.maximumCount = resetsPerWindow
        configuration.streamErrorRateLimit.windowLength = window
        configuration.outboundBufferSizeHighWatermark = WriteBuffers.stream.high
        configuration.outboundBufferSizeLowWatermark = WriteBuffers.stream.low
        return configuration
    }
}

/// Last handler of an overlay connection's pipeline: an error that ends the connection for good (the HTTP/2 handler
/// has sent GOAWAY, or the transport failed) closes it, so whoever owns it reconnects instead of keeping a connection
/// that takes no new circuits. Stream-level errors (a frame for a stream that just closed, a reset race) are normal
/// on a busy connection and leave it alone.
public final class FabricConnectionErrorHandler: ChannelInboundHandler, Sendable {
    public typealias InboundIn = Any

    private let onError: @Sendable (any Error) -> Void

    public init(onError: @escaping @Sendable (any Error) -> Void = { _ in }) {
        self.onError = onError
    }

    public func errorCaught(context: ChannelHandlerContext, error: any Error) {
        guard Self.endsConnection(error) else { return }
        onError(error)
        context.close(promise: nil)
    }

    /// Every error ends the connection except the stream-level ones a busy connection sees in normal operation (a
    /// frame racing a reset). swift-nio-http2 reports connection errors (after which it has sent GOAWAY and ignores
    /// the peer) and stream errors the same way, so this errs on the side of reconnecting.
    static func endsConnection(_ error: any Error) -> Bool {
        !(error is NIOHTTP2Errors.StreamClosed || error is NIOHTTP2Errors.StreamError)
    }
}

extension ChannelPipeline.SynchronousOperations {
    /// An overlay connection's HTTP/2 with `FabricSettings`, behind an `HTTP2FrameAligner` (whole frames in) and a
    /// `TLSRecordCoalescer` (one TLS record, not two, per small frame out). Each stream the peer
    /// opens starts with the handler `acceptStream` makes; without one, the peer may not open streams and each is
    /// closed at once. Every real overlay connection passes a `keepalive` (both ends: a silently dropped link must
    /// be noticed by the side that routes over it and by the side that must redial); tests of other parts may not.
    /// `streamDelegate` is told of every stream created and closed (swift-nio-http2 does not pass those events down
    /// the pipeline).
    @discardableResult
    public func configureFabricHTTP2(
        mode: NIOHTTP2Handler.ParserMode,
        keepalive: KeepaliveHandler? = nil,
        streamDelegate: (any NIOHTTP2StreamDelegate)? = nil,
        maxConcurrentStreams: Int? = nil,
        acceptStream: (@Sendable () -> any ChannelHandler)? = nil
    ) throws -> NIOHTTP2Handler.StreamMultiplexer {
        try addHandler(TLSRecordCoalescer())
        try addHandler(HTTP2FrameAligner(expectsPreface: mode == .server))
        let multiplexer = try configureHTTP2Pipeline(
            mode: mode,
            connectionConfiguration: FabricSettings.connection(maxConcurrentStreams: maxConcurrentStreams),
            streamConfiguration: FabricSettings.stream,
            streamDelegate: streamDelegate
                ?? keepalive.flatMap { $0.countsStreams ? KeepaliveHandler.streamCounter(for: $0, on: eventLoop) : nil }
        ) { stream in
            guard let acceptStream else { return stream.close() }
            return stream.eventLoop.makeCompletedFuture {
                try stream.pipeline.syncOperations.addHandler(acceptStream())
            }
        }
        if let keepalive {
            try addHandler(keepalive)
            try addHandler(AbruptCloseHandler(), position: .first)
        }
        return multiplexer
    }
}
