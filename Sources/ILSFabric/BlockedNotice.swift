public import ILSCore
public import NIOCore
public import NIOHTTP2

/// Why the controller is about to close an overlay connection, when the reason is the identity's own (revoked,
/// disabled, deleted): a GOAWAY (`NO_ERROR`, last stream id 2^31−1, so it refuses no stream by itself) whose debug data
/// is the code, a line feed, and the reason in UTF-8. The controller writes it, then closes the connection
/// (docs/protocol.md, "Data plane").
///
/// Without it a device took the close for a lost path, held its circuits and asked to resume them, and was refused
/// `identity_blocked` one round trip later (issue 49); with it, its circuits end with that code and no resumption is
/// tried. A device that ignores the GOAWAY still ends the same way, one refused resumption later.
public enum BlockedNotice {
    /// The only code sent today; a device ignores a GOAWAY whose debug data starts with anything else.
    public static let code = "identity_blocked"
    /// The reason is cut to this many characters (after escaping) on both sides.
    public static let reasonLimit = 200

    /// The GOAWAY that says `reason` (escaped and bounded: it is shown to a person).
    public static func frame(reason: String) -> HTTP2Frame {
        let text = code + "\n" + ControlCharacters.bounded(reason, limit: reasonLimit)
        return HTTP2Frame(
            streamID: .rootStream,
            payload: .goAway(lastStreamID: .maxID, errorCode: .noError, opaqueData: ByteBuffer(string: text))
        )
    }

    /// The reason a GOAWAY's debug data gives for a blocked identity, or nil if it is not such a notice. The reason
    /// from the network is escaped and bounded before anyone shows it.
    public static func reason(of payload: HTTP2Frame.FramePayload) -> String? {
        guard case .goAway(_, _, let data?) = payload,
            let text = data.getString(at: data.readerIndex, length: min(data.readableBytes, 4 * reasonLimit + 32))
        else { return nil }
        let prefix = code + "\n"
        guard text.hasPrefix(prefix) else { return nil }
        return ControlCharacters.bounded(String(text.dropFirst(prefix.count)), limit: reasonLimit)
    }
}

/// On a device's overlay connection, after the HTTP/2 handler (it sees the root stream's frames): passes each frame
/// on, and calls `onNotice` with the reason of a `BlockedNotice`.
public final class BlockedNoticeHandler: ChannelInboundHandler {
    public typealias InboundIn = HTTP2Frame
    public typealias InboundOut = HTTP2Frame

    private let onNotice: (String) -> Void

    public init(onNotice: @escaping (String) -> Void) {
        self.onNotice = onNotice
    }

    public func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        if let reason = BlockedNotice.reason(of: unwrapInboundIn(data).payload) { onNotice(reason) }
        context.fireChannelRead(data)
    }
}
