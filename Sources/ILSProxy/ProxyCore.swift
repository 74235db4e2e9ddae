import ILSCore
public import Logging
public import NIOCore
import NIOHTTP1

/// The streaming HTTP/1.1 proxy shared by both networking modes.
///
/// HTTP mode puts it on accepted TCP (or TLS) connections; overlay mode puts it on decrypted circuits. Either way
/// the transport hands over a channel that carries the client's bytes plus a `ClientContext` saying who the client
/// is, and the core does the rest: parsing, limits, header rules, backpressure, WebSocket pass-through.
public struct ProxyCore: Sendable {
    public let configuration: ProxyConfiguration
    public let pools: BackendPool
    private let logger: Logger

    public init(configuration: ProxyConfiguration, logger: Logger, loopCount: Int = System.coreCount) {
        self.init(
            configuration: configuration,
            logger: logger,
            pools: BackendPool(configuration: configuration, loopCount: loopCount)
        )
    }

    /// A core whose backend connections come from `pools` (the fuzz targets give it an in-process backend).
    package init(configuration: ProxyConfiguration, logger: Logger, pools: BackendPool) {
        self.configuration = configuration
        self.pools = pools
        self.logger = logger
        InjectedLeak.announce(to: logger)
    }

    /// Adds the HTTP/1.1 server codec and the proxy handler at the end of a client channel's pipeline. Call on the
    /// channel's event loop.
    public func configureClientPipeline(
        _ pipeline: ChannelPipeline.SynchronousOperations,
        client: ClientContext
    ) throws {
        var limits = NIOHTTPDecoderLimitConfiguration()
        limits.maxHeaderListSize = configuration.maxRequestHeaderBytes
        limits.maxHeaderFieldSize = configuration.maxRequestHeaderBytes
        limits.maxHeaderFieldCount = configuration.maxRequestHeaderCount
        // Outbound header validation would re-check, on every response, names and values that the backend
        // connection's parser has already refused unless they were valid tokens and field values (llhttp, strict);
        // what the gateway adds itself is an address, a scheme, or an identity name the controller validated.
        try pipeline.configureHTTPServerPipeline(
            withPipeliningAssistance: true,
            withServerUpgrade: nil,
            withErrorHandling: false,
            withOutboundHeaderValidation: false,
            withEncoderConfiguration: .init(),
            withDecoderLimitConfiguration: limits
        )
        try pipeline.addHandler(
            ProxyServerHandler(configuration: configuration, pools: pools, client: client, logger: logger)
        )
    }
}
