import NIOCore
import NIOEmbedded
import Testing

@testable import ILSGateway

/// `ReadAheadHandler` between a stand-in for the socket (which counts the reads asked of it) and a stand-in for the
/// HTTP pipeline (which can hold its reads, as `HTTPServerPipelineHandler` does between a request and its response).
@Suite("Read-ahead: the socket stays registered while the HTTP pipeline holds its reads")
struct ReadAheadHandlerTests {
    /// What the socket saw: each read asked of it.
    final class Socket: ChannelOutboundHandler {
        typealias OutboundIn = ByteBuffer
        var reads = 0
        /// A read is pending: the socket is registered for reads.
        var pending = false
        func read(context: ChannelHandlerContext) {
            reads += 1
            pending = true
            context.read()
        }
    }

    /// What the pipeline above saw, in order; holds reads while `holding`.
    final class Above: ChannelDuplexHandler {
        typealias InboundIn = ByteBuffer
        typealias OutboundIn = ByteBuffer
        var holding = false
        var seen: [String] = []
        var context: ChannelHandlerContext?
        func handlerAdded(context: ChannelHandlerContext) { self.context = context }
        func handlerRemoved(context: ChannelHandlerContext) { self.context = nil }
        func channelRead(context: ChannelHandlerContext, data: NIOAny) {
            seen.append(String(buffer: unwrapInboundIn(data)))
        }
        func channelReadComplete(context: ChannelHandlerContext) { seen.append("<complete>") }
        func channelInactive(context: ChannelHandlerContext) { seen.append("<inactive>") }
        func read(context: ChannelHandlerContext) {
            if !holding { context.read() }
        }
        /// Stops holding and reads, as the HTTP pipeline does when a response ends.
        func resume() {
            holding = false
            context?.read()
        }
    }

    /// A channel with the handler between the two stand-ins; `body` runs with it, and the channel is torn down
    /// after (a handler keeping its context would otherwise keep the whole pipeline alive).
    static func with(_ body: (Setup) throws -> Void) throws {
        let setup = try Setup()
        defer { _ = try? setup.channel.finish() }
        try body(setup)
    }

    struct Setup {
        let channel = EmbeddedChannel()
        let socket = Socket()
        let above = Above()

        init() throws {
            try channel.pipeline.syncOperations.addHandlers(socket, ReadAheadHandler(), above)
            try channel.connect(to: SocketAddress(ipAddress: "127.0.0.1", port: 8080)).wait()
        }

        /// One read burst from the socket, as swift-nio's socket channel delivers it: the read is consumed, the
        /// bytes and the end of the burst go up, and then (`autoRead`) the pipeline is asked for its next read only
        /// if no read is pending already.
        func burst(_ text: String) {
            socket.pending = false
            channel.pipeline.fireChannelRead(ByteBuffer(string: text))
            channel.pipeline.fireChannelReadComplete()
            if !socket.pending { channel.read() }
        }
    }

    @Test("a read stays pending at the socket after each burst, even while the pipeline above holds its reads")
    func keepsReading() throws {
        try Self.with { setup in
            setup.channel.read()
            #expect(setup.socket.reads == 1)
            setup.above.holding = true  // the request ended; its response is on its way
            setup.burst("GET /1")
            #expect(setup.above.seen == ["GET /1", "<complete>"])
            #expect(setup.socket.reads == 2, "without read-ahead the socket would have no read pending and deregister")
        }
    }

    @Test("while the pipeline above keeps reading, every burst goes straight up and nothing is held")
    func passesThrough() throws {
        try Self.with { setup in
            setup.channel.read()
            setup.burst("GET /1")
            setup.burst("GET /2")
            #expect(setup.above.seen == ["GET /1", "<complete>", "GET /2", "<complete>"])
            #expect(setup.socket.pending)
        }
    }

    @Test("bytes that arrive while the pipeline holds its reads wait, whole and in order, and nothing more is read")
    func holdsThenDelivers() throws {
        try Self.with { setup in
            setup.channel.read()
            setup.above.holding = true
            setup.burst("GET /1")
            let readsBefore = setup.socket.reads
            setup.burst("GET /2 part one, ")
            #expect(setup.above.seen == ["GET /1", "<complete>"])
            #expect(setup.socket.reads == readsBefore, "holding a burst, the handler must stop reading")

            setup.above.resume()
            #expect(setup.above.seen == ["GET /1", "<complete>"], "never delivered from inside the read call")
            setup.channel.embeddedEventLoop.run()
            #expect(setup.above.seen == ["GET /1", "<complete>", "GET /2 part one, ", "<complete>"])
            #expect(setup.socket.reads > readsBefore, "reading resumes once the held bytes are taken")

            setup.burst("part two")
            #expect(setup.above.seen.suffix(2) == ["part two", "<complete>"])
        }
    }

    @Test("held bytes come before the close")
    func heldBeforeClose() throws {
        try Self.with { setup in
            setup.channel.read()
            setup.above.holding = true
            setup.burst("GET /1")
            setup.burst("GET /2")
            setup.channel.pipeline.fireChannelInactive()
            #expect(setup.above.seen == ["GET /1", "<complete>", "GET /2", "<complete>", "<inactive>"])
        }
    }
}
