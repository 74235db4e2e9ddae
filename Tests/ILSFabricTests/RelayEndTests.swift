import ILSFabric
import NIOConcurrencyHelpers
import NIOCore
import NIOEmbedded
import NIOHTTP2
import Testing

/// The relay's splice at a circuit's end: a clean end must not cut what the relay already accepted.
@Suite("The relay ends a circuit without cutting its tail")
struct RelayEndTests {
    /// The partner stream's writes, held as if its reader's flow-control window were full.
    final class HeldWrites: ChannelOutboundHandler, Sendable {
        typealias OutboundIn = HTTP2Frame.FramePayload
        let promises = NIOLockedValueBox<[EventLoopPromise<Void>]>([])

        func write(context: ChannelHandlerContext, data: NIOAny, promise: EventLoopPromise<Void>?) {
            if let promise { promises.withLockedValue { $0.append(promise) } }
        }

        func release() {
            for promise in promises.withLockedValue({ held in
                defer { held = [] }
                return held
            }) { promise.succeed() }
        }
    }

    static func splice() throws -> (relay: EmbeddedChannel, partner: EmbeddedChannel, held: HeldWrites) {
        let loop = EmbeddedEventLoop()
        let held = HeldWrites()
        let partner = EmbeddedChannel(handler: held, loop: loop)
        let relay = EmbeddedChannel(handler: RelayHandler(partner: partner), loop: loop)
        try partner.connect(to: SocketAddress(ipAddress: "127.0.0.1", port: 1)).wait()
        try relay.connect(to: SocketAddress(ipAddress: "127.0.0.1", port: 2)).wait()
        return (relay, partner, held)
    }

    static func data(_ text: String, end: Bool) -> HTTP2Frame.FramePayload {
        .data(.init(data: .byteBuffer(ByteBuffer(string: text)), endStream: end))
    }

    @Test("once the relay has cut the circuit, nothing more it reads goes to the partner")
    func severedPassesNothing() throws {
        let loop = EmbeddedEventLoop()
        let held = HeldWrites()
        let partner = EmbeddedChannel(handler: held, loop: loop)
        let severed = NIOLockedValueBox(false)
        let relay = EmbeddedChannel(
            handler: RelayHandler(partner: partner, isSevered: { severed.withLockedValue { $0 } }),
            loop: loop
        )
        defer {
            _ = try? relay.finish(acceptAlreadyClosed: true)
            _ = try? partner.finish(acceptAlreadyClosed: true)
        }
        try relay.writeInbound(Self.data("an answer's record", end: false))
        relay.pipeline.fireChannelReadComplete()
        #expect(held.promises.withLockedValue { $0.count } == 1)
        severed.withLockedValue { $0 = true }
        try relay.writeInbound(Self.data("the gateway's CANCEL", end: false))
        relay.pipeline.fireChannelReadComplete()
        #expect(held.promises.withLockedValue { $0.count } == 1, "relayed after the cut")
        held.release()
    }

    @Test("a cut circuit's stream that closes leaves its partner to the cut (which resets it with its own code)")
    func severedLeavesThePartnerToTheCut() throws {
        let loop = EmbeddedEventLoop()
        let partner = EmbeddedChannel(loop: loop)
        let severed = NIOLockedValueBox(false)
        let relay = EmbeddedChannel(
            handler: RelayHandler(partner: partner, isSevered: { severed.withLockedValue { $0 } }),
            loop: loop
        )
        defer { _ = try? partner.finish(acceptAlreadyClosed: true) }
        try partner.connect(to: SocketAddress(ipAddress: "127.0.0.1", port: 1)).wait()
        try relay.connect(to: SocketAddress(ipAddress: "127.0.0.1", port: 1)).wait()
        severed.withLockedValue { $0 = true }
        _ = try? relay.finish(acceptAlreadyClosed: true)
        loop.run()
        #expect(partner.isActive, "the relay closed the partner of a cut circuit ahead of the cut's reset")
    }

    @Test("after END_STREAM, the partner is closed only once the relayed bytes were written to it")
    func cleanEndWaitsForTheTail() throws {
        let (relay, partner, held) = try Self.splice()
        defer { _ = try? partner.finish(acceptAlreadyClosed: true) }
        try relay.writeInbound(Self.data("the last record", end: true))
        _ = try? relay.finish(acceptAlreadyClosed: true)
        #expect(partner.isActive)
        held.release()
        relay.embeddedEventLoop.run()
        #expect(!partner.isActive)
    }

    /// A reset after DATA (a CANCEL record, then RST_STREAM) must not discard that DATA on the partner: the partner
    /// is reset once it has been written there, or after `resetLinger` if it never is.
    @Test("a stream that ends without END_STREAM (a reset) closes its partner once the relayed bytes are written")
    func resetWaitsForTheTail() throws {
        let (relay, partner, held) = try Self.splice()
        defer { _ = try? partner.finish(acceptAlreadyClosed: true) }
        try relay.writeInbound(Self.data("CANCEL", end: false))
        _ = try? relay.finish(acceptAlreadyClosed: true)
        #expect(partner.isActive)
        held.release()
        relay.embeddedEventLoop.run()
        #expect(!partner.isActive)
    }

    @Test("a reset whose relayed bytes are never written closes its partner after the linger")
    func resetIsBounded() throws {
        let (relay, partner, held) = try Self.splice()
        defer {
            // Held writes keep their promises, and with them the channels, until released.
            held.release()
            _ = try? partner.finish(acceptAlreadyClosed: true)
        }
        try relay.writeInbound(Self.data("part", end: false))
        // Closed, not `finish`ed: `finish` cancels the embedded loop's scheduled tasks, the linger among them.
        relay.close(promise: nil)
        relay.embeddedEventLoop.run()
        let before = partner.isActive
        relay.embeddedEventLoop.advanceTime(by: RelayHandler.resetLinger)
        let after = partner.isActive
        #expect(before)
        #expect(!after)
    }

    @Test("a reset with nothing relayed closes its partner at once")
    func emptyResetClosesAtOnce() throws {
        let (relay, partner, _) = try Self.splice()
        defer { _ = try? partner.finish(acceptAlreadyClosed: true) }
        _ = try? relay.finish(acceptAlreadyClosed: true)
        #expect(!partner.isActive)
    }
}
