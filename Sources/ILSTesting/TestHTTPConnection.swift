public import NIOCore
public import NIOPosix
import NIOSSL

/// A deliberately raw HTTP/1.1 client for tests: it sends exactly the bytes it is given (so tests can send malformed
/// and smuggling requests) and parses responses itself, exposing each body piece as it arrives (so tests can see
/// streaming, and can stop reading to exercise backpressure).
/// Use it from one task at a time: it is `@unchecked Sendable` only so tests can hand it to a helper task.
public final class TestHTTPConnection: @unchecked Sendable {
    public struct ResponseHead: Sendable {
        public var status: Int
        public var headers: [(name: String, value: String)]

        public func header(_ name: String) -> String? {
            headers.first { $0.name.lowercased() == name.lowercased() }?.value
        }

        public func values(_ name: String) -> [String] {
            headers.filter { $0.name.lowercased() == name.lowercased() }.map(\.value)
        }
    }

    public enum Failure: Error {
        case closedBeforeHead
        case malformedResponse(String)
        case truncatedBody
    }

    private enum BodyMode {
        case none
        case length(Int)
        case chunked
        case untilClose
    }

    private let channel: NIOAsyncChannel<ByteBuffer, ByteBuffer>
    private var inbound: NIOAsyncChannelInboundStream<ByteBuffer>.AsyncIterator
    private let outbound: NIOAsyncChannelOutboundWriter<ByteBuffer>
    private var buffer = ByteBuffer()
    private var sawEOF = false
    private var bodyMode = BodyMode.none
    private var chunkRemaining = 0

    /// Connects to `port` on 127.0.0.1, over TLS when `trustRootPEM` (the CA to trust) is given. `configure` adds
    /// handlers between the socket and the test's raw bytes (e.g. an end-to-end encryption layer). `firstBytes` are
    /// written by the event loop the moment the connection is up: a test of a server deadline that starts at accept
    /// (an idle timeout) must not lose the race to a loaded machine scheduling the test's task after the deadline.
    public init(
        port: Int,
        trustRootPEM: String? = nil,
        firstBytes: String? = nil,
        group: any EventLoopGroup = MultiThreadedEventLoopGroup.singleton,
        configure: (@Sendable (ChannelPipeline.SynchronousOperations) throws -> Void)? = nil
    ) async throws {
        let sslContext: NIOSSLContext? = try trustRootPEM.map { pem in
            var tls = TLSConfiguration.makeClientConfiguration()
            tls.trustRoots = .certificates(try NIOSSLCertificate.fromPEMBytes(Array(pem.utf8)))
            tls.applicationProtocols = ["http/1.1"]
            return try NIOSSLContext(configuration: tls)
        }
        let channel = try await ClientBootstrap(group: group)
            .connect(host: "127.0.0.1", port: port) { channel in
                channel.eventLoop.makeCompletedFuture {
                    if let sslContext {
                        try channel.pipeline.syncOperations.addHandler(
                            NIOSSLClientHandler(context: sslContext, serverHostname: "localhost")
                        )
                    }
                    try configure?(channel.pipeline.syncOperations)
                    if let firstBytes {
                        try channel.pipeline.syncOperations.addHandler(
                            WriteOnActive(bytes: ByteBuffer(string: firstBytes))
                        )
                    }
                    return try NIOAsyncChannel<ByteBuffer, ByteBuffer>(
                        wrappingChannelSynchronously: channel,
                        configuration: .init(backPressureStrategy: .init(lowWatermark: 2, highWatermark: 4))
                    )
                }
            }
        self.channel = channel
        self.inbound = channel.inbound.makeAsyncIterator()
        self.outbound = channel.outbound
    }

    deinit {
        outbound.finish()
    }

    public func send(_ text: String) async throws {
        try await outbound.write(ByteBuffer(string: text))
    }

    public func send(_ bytes: ByteBuffer) async throws {
        try await outbound.write(bytes)
    }

    /// Sends a whole request with a `Content-Length` body.
    public func sendRequest(
        _ method: String,
        _ path: String,
        headers: [(String, String)] = [],
        body: ByteBuffer? = nil
    ) async throws {
        var head = "\(method) \(path) HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        for (name, value) in headers { head += "\(name): \(value)\r\n" }
        if let body { head += "Content-Length: \(body.readableBytes)\r\n" }
        head += "\r\n"
        try await send(head)
        if let body { try await send(body) }
    }

    /// Half-closes the sending side after the request, as a client that is done talking would.
    public func close() async {
        outbound.finish()
        try? await channel.channel.close()
    }

    /// Reads until the response head is complete.
    public func readHead() async throws -> ResponseHead {
        while true {
            if let end = buffer.readableBytesView.firstRange(of: [13, 10, 13, 10]) {
                let length = end.upperBound - buffer.readerIndex
                let text = buffer.readString(length: length)!
                return try parseHead(text)
            }
            guard try await fill() else { throw Failure.closedBeforeHead }
        }
    }

    /// The next piece of body as it arrived, decoded from chunked framing; `nil` at the end of the body.
    public func readBodyPart() async throws -> ByteBuffer? {
        switch bodyMode {
        case .none:
            return nil
        case .length(let remaining):
            if remaining == 0 {
                bodyMode = .none
                return nil
            }
            if buffer.readableBytes == 0 {
                guard try await fill() else { throw Failure.truncatedBody }
            }
            let take = min(remaining, buffer.readableBytes)
            bodyMode = .length(remaining - take)
            return buffer.readSlice(length: take)
        case .untilClose:
            if buffer.readableBytes == 0 {
                guard try await fill() else {
                    bodyMode = .none
                    return nil
                }
            }
            return buffer.readSlice(length: buffer.readableBytes)
        case .chunked:
            return try await readChunkedPart()
        }
    }

    /// The whole remaining body.
    public func readBody() async throws -> ByteBuffer {
        var all = ByteBuffer()
        while var part = try await readBodyPart() { all.writeBuffer(&part) }
        return all
    }

    /// Whatever bytes come next, unparsed (for a connection that switched protocols).
    public func readRaw() async throws -> ByteBuffer {
        if buffer.readableBytes == 0 {
            guard try await fill() else { throw Failure.truncatedBody }
        }
        return buffer.readSlice(length: buffer.readableBytes)!
    }

    /// Reads and discards body bytes, returning how many there were.
    public func drainBody() async throws -> Int {
        var count = 0
        while let part = try await readBodyPart() { count += part.readableBytes }
        return count
    }

    /// Waits for the server to close the connection; returns the bytes that came before the close.
    public func readUntilClosed() async throws -> ByteBuffer {
        while try await fill() {}
        return buffer.readSlice(length: buffer.readableBytes)!
    }

    /// Whether the server closed the connection (reads return end of stream) within `limit`, rather than going on
    /// sending (or sitting idle): false after `limit`, so a stream that is never cut fails its test instead of
    /// hanging it.
    public func isClosedByPeer(within limit: Duration = .seconds(60)) async -> Bool {
        await Self.answer(within: limit) {
            do {
                while try await self.fill() {}
                return true
            } catch {
                return !Task.isCancelled
            }
        }
    }

    /// Reads body parts until the response ends or breaks; whether it did within `limit`.
    public func bodyEnds(within limit: Duration) async -> Bool {
        await Self.answer(within: limit) {
            do {
                while try await self.readBodyPart() != nil {}
            } catch {}
            return !Task.isCancelled
        }
    }

    /// `body`'s answer, or false when it has none within `limit` (it is then cancelled).
    private static func answer(within limit: Duration, _ body: @escaping @Sendable () async -> Bool) async -> Bool {
        await withTaskGroup(of: Bool.self) { group in
            group.addTask { await body() }
            group.addTask {
                try? await Task.sleep(for: limit)
                return false
            }
            let first = await group.next() ?? false
            group.cancelAll()
            return first
        }
    }

    private func fill() async throws -> Bool {
        if sawEOF { return false }
        do {
            guard var next = try await inbound.next() else {
                sawEOF = true
                return false
            }
            if buffer.readableBytes == 0 {
                buffer = next
            } else {
                buffer.discardReadBytes()
                buffer.writeBuffer(&next)
            }
            return true
        } catch let error as NIOSSLError where error == .uncleanShutdown {
            sawEOF = true
            return false
        } catch let error as IOError where error.errnoCode == 104 {
            sawEOF = true
            return false
        }
    }

    private func parseHead(_ text: String) throws -> ResponseHead {
        let lines = text.split(separator: "\r\n", omittingEmptySubsequences: true)
        guard let statusLine = lines.first else { throw Failure.malformedResponse(text) }
        let parts = statusLine.split(separator: " ", maxSplits: 2)
        guard parts.count >= 2, parts[0].hasPrefix("HTTP/1."), let status = Int(parts[1]) else {
            throw Failure.malformedResponse(String(statusLine))
        }
        var headers: [(name: String, value: String)] = []
        for line in lines.dropFirst() {
            guard let colon = line.firstIndex(of: ":") else { throw Failure.malformedResponse(String(line)) }
            let name = String(line[..<colon])
            let value = line[line.index(after: colon)...].drop { $0 == " " }
            headers.append((name, String(value)))
        }
        let head = ResponseHead(status: status, headers: headers)
        if status == 101 || status == 204 || status == 304 || (100..<200).contains(status) {
            bodyMode = .none
        } else if head.header("transfer-encoding")?.lowercased() == "chunked" {
            bodyMode = .chunked
            chunkRemaining = 0
        } else if let length = head.header("content-length").flatMap(Int.init) {
            bodyMode = .length(length)
        } else {
            bodyMode = .untilClose
        }
        return head
    }

    private func readChunkedPart() async throws -> ByteBuffer? {
        while chunkRemaining == 0 {
            guard let lineEnd = buffer.readableBytesView.firstRange(of: [13, 10]) else {
                guard try await fill() else { throw Failure.truncatedBody }
                continue
            }
            let line = buffer.readString(length: lineEnd.lowerBound - buffer.readerIndex)!
            buffer.moveReaderIndex(forwardBy: 2)
            if line.isEmpty { continue }  // the CRLF after a chunk's data
            let sizeText = line.split(separator: ";").first.map(String.init) ?? ""
            guard let size = Int(sizeText, radix: 16) else { throw Failure.malformedResponse("chunk size \(line)") }
            if size == 0 {
                // Trailers end with an empty line.
                while true {
                    if let end = buffer.readableBytesView.firstRange(of: [13, 10]) {
                        let trailer = buffer.readString(length: end.lowerBound - buffer.readerIndex)!
                        buffer.moveReaderIndex(forwardBy: 2)
                        if trailer.isEmpty { break }
                    } else {
                        guard try await fill() else { throw Failure.truncatedBody }
                    }
                }
                bodyMode = .none
                return nil
            }
            chunkRemaining = size
        }
        if buffer.readableBytes == 0 {
            guard try await fill() else { throw Failure.truncatedBody }
        }
        let take = min(chunkRemaining, buffer.readableBytes)
        chunkRemaining -= take
        return buffer.readSlice(length: take)
    }
}

extension ByteBufferView {
    fileprivate func firstRange(of pattern: [UInt8]) -> Range<Int>? {
        guard count >= pattern.count else { return nil }
        var index = startIndex
        while index <= endIndex - pattern.count {
            if self[index] == pattern[0] {
                var matched = true
                for offset in 1..<pattern.count where self[index + offset] != pattern[offset] {
                    matched = false
                    break
                }
                if matched { return index..<(index + pattern.count) }
            }
            index += 1
        }
        return nil
    }
}

/// Writes its bytes when the channel becomes active, then stays out of the way.
private final class WriteOnActive: ChannelInboundHandler {
    typealias InboundIn = ByteBuffer
    private let bytes: ByteBuffer

    init(bytes: ByteBuffer) { self.bytes = bytes }

    func channelActive(context: ChannelHandlerContext) {
        context.fireChannelActive()
        context.writeAndFlush(NIOAny(bytes), promise: nil)
    }
}
