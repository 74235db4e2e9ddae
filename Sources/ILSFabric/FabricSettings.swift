public import NIOHTTP2

/// HTTP/2 settings shared by every overlay connection.
public enum FabricSettings {
    public static var connection: NIOHTTP2Handler.ConnectionConfiguration {
        var configuration = NIOHTTP2Handler.ConnectionConfiguration()
        configuration.initialSettings = [
            HTTP2Setting(parameter: .maxConcurrentStreams, value: 16384),
            HTTP2Setting(parameter: .initialWindowSize, value: FabricProtocol.streamWindow),
            HTTP2Setting(parameter: .maxHeaderListSize, value: 16384),
        ]
        return configuration
    }

    public static var stream: NIOHTTP2Handler.StreamConfiguration {
        var configuration = NIOHTTP2Handler.StreamConfiguration()
        configuration.targetWindowSize = FabricProtocol.streamWindow
        return configuration
    }
}
