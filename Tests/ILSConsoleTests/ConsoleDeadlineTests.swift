import HTTPTypes
import NIOCore
import NIOEmbedded
import NIOHTTPTypes
import Testing

@testable import ILSConsole

/// Every console connection is under a deadline whenever its client owes bytes, counted from a fixed point (never
/// reset by a byte), and under none while the console itself works or answers.
@Suite("Console connection deadlines")
struct ConsoleDeadlineTests {
    static let deadlines = ConsoleDeadlines(firstHead: .seconds(10), body: .seconds(7), idle: .seconds(30))

    @Test("a request then its answer: first head, body, no deadline while answering, then idle")
    func oneRequest() {
        var machine = ConsoleDeadlineMachine(deadlines: Self.deadlines)
        #expect(machine.started() == .arm(.seconds(10)))
        #expect(machine.head() == .arm(.seconds(7)))
        #expect(machine.requestEnded() == .disarm)
        #expect(machine.responseEnded() == .arm(.seconds(30)))
        // The next request on the kept-alive connection.
        #expect(machine.head() == .arm(.seconds(7)))
        #expect(machine.requestEnded() == .disarm)
        #expect(machine.responseEnded() == .arm(.seconds(30)))
    }

    @Test("answered before its body ended (a refusal): the body's deadline holds until the end, then idle")
    func answeredBeforeTheBody() {
        var machine = ConsoleDeadlineMachine(deadlines: Self.deadlines)
        _ = machine.started()
        #expect(machine.head() == .arm(.seconds(7)))
        // The refusal is written while the body still trickles in: the body's deadline must not be lifted.
        #expect(machine.responseEnded() == .keep)
        #expect(machine.requestEnded() == .arm(.seconds(30)))
    }

    @Test("pipelined requests: no deadline until every answer is written, then idle")
    func pipelined() {
        var machine = ConsoleDeadlineMachine(deadlines: Self.deadlines)
        _ = machine.started()
        #expect(machine.head() == .arm(.seconds(7)))
        #expect(machine.requestEnded() == .disarm)
        #expect(machine.head() == .arm(.seconds(7)))
        #expect(machine.requestEnded() == .disarm)
        #expect(machine.responseEnded() == .keep)
        #expect(machine.responseEnded() == .arm(.seconds(30)))
    }

    @Test("an answer to an earlier request while a later body is read keeps the body's deadline")
    func answerDuringALaterBody() {
        var machine = ConsoleDeadlineMachine(deadlines: Self.deadlines)
        _ = machine.started()
        _ = machine.head()
        #expect(machine.requestEnded() == .disarm)
        #expect(machine.head() == .arm(.seconds(7)))
        #expect(machine.responseEnded() == .keep)
        #expect(machine.requestEnded() == .disarm)
        #expect(machine.responseEnded() == .arm(.seconds(30)))
    }

    @Test("the handler closes a connection whose head never completes, however the bytes trickle")
    func handlerClosesASilentConnection() throws {
        let loop = EmbeddedEventLoop()
        let channel = EmbeddedChannel(handler: ConsoleDeadlineHandler(deadlines: Self.deadlines), loop: loop)
        try channel.connect(to: SocketAddress(ipAddress: "127.0.0.1", port: 1)).wait()
        loop.advanceTime(by: .seconds(9))
        #expect(channel.isActive)
        loop.advanceTime(by: .seconds(1))
        #expect(!channel.isActive)
    }

    @Test("the handler closes a connection whose body trickles past its deadline, and spares one at work")
    func handlerClosesATrickledBody() throws {
        let loop = EmbeddedEventLoop()
        let channel = EmbeddedChannel(handler: ConsoleDeadlineHandler(deadlines: Self.deadlines), loop: loop)
        try channel.connect(to: SocketAddress(ipAddress: "127.0.0.1", port: 1)).wait()
        let head = HTTPRequest(method: .post, scheme: nil, authority: "127.0.0.1", path: "/identities")
        try channel.writeInbound(HTTPRequestPart.head(head))
        try channel.writeInbound(HTTPRequestPart.end(nil))
        // The console works on a complete request for as long as it takes: no deadline.
        loop.advanceTime(by: .seconds(60))
        #expect(channel.isActive)
        try channel.writeOutbound(HTTPResponsePart.head(HTTPResponse(status: .ok)))
        try channel.writeOutbound(HTTPResponsePart.end(nil))
        // Then the next head is owed within the idle deadline; a byte a second of body does not extend one.
        try channel.writeInbound(HTTPRequestPart.head(head))
        for _ in 0..<6 {
            loop.advanceTime(by: .seconds(1))
            try channel.writeInbound(HTTPRequestPart.body(ByteBuffer(string: "x")))
        }
        #expect(channel.isActive)
        loop.advanceTime(by: .seconds(1))
        #expect(!channel.isActive)
        _ = try? channel.finish()
    }

    @Test("a client that stops reading an answer is cut after the unread deadline; one that reads again is not")
    func handlerClosesAClientThatDoesNotRead() throws {
        let loop = EmbeddedEventLoop()
        let channel = EmbeddedChannel(handler: ConsoleDeadlineHandler(deadlines: Self.deadlines), loop: loop)
        try channel.connect(to: SocketAddress(ipAddress: "127.0.0.1", port: 1)).wait()
        let head = HTTPRequest(method: .get, scheme: nil, authority: "127.0.0.1", path: "/audit")
        try channel.writeInbound(HTTPRequestPart.head(head))
        try channel.writeInbound(HTTPRequestPart.end(nil))
        try channel.writeOutbound(HTTPResponsePart.head(HTTPResponse(status: .ok)))
        // The answer fills the socket: unwritable for 20 s, then read again. No deadline ran meanwhile.
        channel.isWritable = false
        channel.pipeline.fireChannelWritabilityChanged()
        loop.advanceTime(by: .seconds(20))
        channel.isWritable = true
        channel.pipeline.fireChannelWritabilityChanged()
        loop.advanceTime(by: .seconds(20))
        #expect(channel.isActive)
        // Then the client stops reading for good.
        channel.isWritable = false
        channel.pipeline.fireChannelWritabilityChanged()
        loop.advanceTime(by: .seconds(29))
        #expect(channel.isActive)
        loop.advanceTime(by: .seconds(1))
        #expect(!channel.isActive)
        _ = try? channel.finish()
    }
}
