import NIOConcurrencyHelpers
import NIOCore
import NIOEmbedded
import NIOHTTP1
import Testing

@testable import ILSGateway

/// The proxy core's close of a circuit, as the end-to-end layer below is asked to do it.
@Suite("A circuit closed between exchanges ends cleanly; one closed mid-response is cut")
struct CircuitCloseHandlerTests {
    /// Records the close modes that reach the bottom of the pipeline (where `E2EResponderHandler` sits), and keeps
    /// a half-close from closing the embedded channel.
    final class CloseModes: ChannelOutboundHandler, Sendable {
        typealias OutboundIn = NIOAny
        let modes = NIOLockedValueBox<[CloseMode]>([])

        func write(context: ChannelHandlerContext, data: NIOAny, promise: EventLoopPromise<Void>?) {
            promise?.succeed()
        }

        func close(context: ChannelHandlerContext, mode: CloseMode, promise: EventLoopPromise<Void>?) {
            modes.withLockedValue { $0.append(mode) }
            if mode == .output {
                promise?.succeed()
            } else {
                context.close(mode: mode, promise: promise)
            }
        }
    }

    static func circuit() throws -> (EmbeddedChannel, CloseModes) {
        let modes = CloseModes()
        let channel = EmbeddedChannel(handlers: [modes, CircuitCloseHandler(lingerTimeout: .seconds(5))])
        try channel.connect(to: SocketAddress(ipAddress: "127.0.0.1", port: 1)).wait()
        return (channel, modes)
    }

    static let head = HTTPServerResponsePart.head(HTTPResponseHead(version: .http1_1, status: .ok))

    @Test("a close after a complete response is a half-close, and the circuit is closed after the linger time")
    func closeAfterResponseIsClean() throws {
        let (channel, modes) = try Self.circuit()
        defer { _ = try? channel.finish(acceptAlreadyClosed: true) }
        channel.write(Self.head, promise: nil)
        channel.write(HTTPServerResponsePart.body(.byteBuffer(ByteBuffer(string: "ok"))), promise: nil)
        channel.writeAndFlush(HTTPServerResponsePart.end(nil), promise: nil)
        channel.close(promise: nil)
        #expect(modes.modes.withLockedValue { $0 } == [.output])
        #expect(channel.isActive)
        channel.embeddedEventLoop.advanceTime(by: .seconds(5))
        #expect(modes.modes.withLockedValue { $0 } == [.output, .all])
        #expect(!channel.isActive)
    }

    @Test("a close with no exchange at all (the idle timeout) is a half-close")
    func idleCloseIsClean() throws {
        let (channel, modes) = try Self.circuit()
        defer { _ = try? channel.finish(acceptAlreadyClosed: true) }
        channel.close(promise: nil)
        #expect(modes.modes.withLockedValue { $0 } == [.output])
    }

    @Test("a close mid-response (after an interim 100) is a full close")
    func closeMidResponseIsCut() throws {
        let (channel, modes) = try Self.circuit()
        defer { _ = try? channel.finish(acceptAlreadyClosed: true) }
        channel.write(HTTPServerResponsePart.head(HTTPResponseHead(version: .http1_1, status: .continue)), promise: nil)
        channel.write(Self.head, promise: nil)
        channel.writeAndFlush(HTTPServerResponsePart.body(.byteBuffer(ByteBuffer(string: "partial"))), promise: nil)
        channel.close(promise: nil)
        #expect(modes.modes.withLockedValue { $0 } == [.all])
        #expect(!channel.isActive)
    }

    @Test("a revoked identity's circuit is cut even between exchanges, never ended cleanly")
    func abortBetweenExchanges() throws {
        let (channel, modes) = try Self.circuit()
        defer { _ = try? channel.finish(acceptAlreadyClosed: true) }
        CircuitCloseHandler.abort(channel)
        channel.embeddedEventLoop.run()
        #expect(modes.modes.withLockedValue { $0 } == [.all])
        #expect(!channel.isActive)
    }

    @Test("after the clean end, what the device still sends does not reach the proxy core")
    func inputAfterTheEndIsDropped() throws {
        let (channel, _) = try Self.circuit()
        defer { _ = try? channel.finish(acceptAlreadyClosed: true) }
        channel.close(promise: nil)
        try channel.writeInbound(HTTPServerRequestPart.head(HTTPRequestHead(version: .http1_1, method: .GET, uri: "/")))
        #expect(try channel.readInbound(as: HTTPServerRequestPart.self) == nil)
    }
}
