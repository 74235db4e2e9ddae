import ILSFabric
import NIOConcurrencyHelpers
import NIOCore
import NIOEmbedded
import NIOHTTP2
import Testing

@Suite("The controller's notice that an identity is blocked")
struct BlockedNoticeTests {
    @Test("the GOAWAY's debug data gives the reason back, escaped and bounded; it refuses no stream")
    func roundTrip() throws {
        let frame = BlockedNotice.frame(reason: "identity 'tab' is revoked")
        guard case .goAway(let last, let code, _) = frame.payload else {
            Issue.record("not a GOAWAY: \(frame.payload)")
            return
        }
        #expect(last == .maxID)
        #expect(code == .noError)
        #expect(BlockedNotice.reason(of: frame.payload) == "identity 'tab' is revoked")

        let hostile = "\u{1B}[2Jrevoked\n" + String(repeating: "x", count: 10_000)
        let reason = try #require(BlockedNotice.reason(of: BlockedNotice.frame(reason: hostile).payload))
        #expect(!reason.contains("\u{1B}") && !reason.contains("\n"))
        #expect(reason.count <= BlockedNotice.reasonLimit)
    }

    @Test("a GOAWAY without the notice's code, or without debug data, is no notice")
    func otherGoAways() {
        let other = HTTP2Frame.FramePayload.goAway(
            lastStreamID: .maxID,
            errorCode: .noError,
            opaqueData: ByteBuffer(string: "going away\nidentity 'tab' is revoked")
        )
        #expect(BlockedNotice.reason(of: other) == nil)
        #expect(BlockedNotice.reason(of: .goAway(lastStreamID: .maxID, errorCode: .noError, opaqueData: nil)) == nil)
        #expect(BlockedNotice.reason(of: .ping(HTTP2PingData(), ack: false)) == nil)
    }

    @Test("the device's handler reports the notice and passes every frame on")
    func handler() throws {
        let heard = NIOLockedValueBox<[String]>([])
        let channel = EmbeddedChannel(
            handler: BlockedNoticeHandler { reason in heard.withLockedValue { $0.append(reason) } }
        )
        try channel.writeInbound(HTTP2Frame(streamID: .rootStream, payload: .ping(HTTP2PingData(), ack: false)))
        try channel.writeInbound(BlockedNotice.frame(reason: "identity 'tab' is disabled"))
        #expect(heard.withLockedValue { $0 } == ["identity 'tab' is disabled"])
        #expect(try channel.readInbound(as: HTTP2Frame.self) != nil)
        #expect(try channel.readInbound(as: HTTP2Frame.self) != nil)
        _ = try channel.finish()
    }
}
