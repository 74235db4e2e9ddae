import Foundation
import NIOCore
import NIOHTTP1

#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// One HTTP/1.1 request and its response over one circuit: the app's `URLRequest` is encoded with NIOHTTP1 onto
/// the circuit's plaintext, and the response is parsed with NIOHTTP1 as its bytes arrive (`OverlayResponseReader`).
///
/// Each exchange has a circuit of its own, closed when the exchange is done or given up: closing the circuit is
/// what tells the gateway to close its backend connection, which is how a cancelled request stops the backend's
/// generation.
final class OverlayExchange: Sendable {
    /// How many body bytes go into one write: big enough to keep the circuit's records full, small enough that an
    /// upload of any size holds only a few of them at a time.
    static let chunkSize = 64 * 1024

    let channel: any Channel
    private let reader: NIOLoopBound<OverlayResponseReader>
    /// The request's end went with its head (it has no body): `send` has nothing to write.
    private let endedWithHead: Bool

    private init(channel: any Channel, reader: NIOLoopBound<OverlayResponseReader>, endedWithHead: Bool) {
        self.channel = channel
        self.reader = reader
        self.endedWithHead = endedWithHead
    }

    /// Dials `service`, sets up HTTP/1.1 on the circuit and sends the request head; with no body (`.none`, every
    /// plain GET) the request's end too, in the same flush: one end-to-end record, one DATA frame through each hop.
    /// (Sent apart, the end was a second, empty record that woke the controller and the gateway once more per
    /// request.) `send` then has nothing left to write.
    static func open(
        dialer: OverlayDialer,
        service: String,
        head: HTTPRequestHead,
        body: OverlayRequestBody,
        idleTimeout: TimeAmount
    ) async throws -> OverlayExchange {
        let channel = try await dialer.dial(service: service).get()
        do {
            let ended = if case .none = body { true } else { false }
            return try await channel.eventLoop.submit {
                let pipeline = channel.pipeline.syncOperations
                try pipeline.addHTTPClientHandlers(leftOverBytesStrategy: .dropBytes)
                let reader = OverlayResponseReader(idleTimeout: idleTimeout)
                try pipeline.addHandler(reader)
                // On the circuit's loop, on a circuit just opened (writable, nothing queued): no need to wait.
                channel.write(HTTPClientRequestPart.head(head), promise: nil)
                if ended { channel.write(HTTPClientRequestPart.end(nil), promise: nil) }
                channel.flush()
                return OverlayExchange(
                    channel: channel,
                    reader: NIOLoopBound(reader, eventLoop: channel.eventLoop),
                    endedWithHead: ended
                )
            }.get()
        } catch {
            channel.close(promise: nil)
            throw error
        }
    }

    /// Writes one request part and waits until the circuit has taken it: its promise completes at once while the
    /// circuit is writable, and only once it is writable again when this part filled it, so the sender goes no
    /// faster than the gateway acknowledges. (It used to wait only when `channel.isWritable` said no; read off the
    /// circuit's loop, right after a write only queued there, that still said yes, so an upload could queue megabytes
    /// past the circuit's bound, and the gateway cut the circuit for sending more than it may: `not_resumed` in
    /// URLSessionTests' 16 MiB upload under ASan.)
    static func write(_ part: HTTPClientRequestPart, on channel: any Channel) async throws {
        let written = channel.eventLoop.makePromise(of: Void.self)
        channel.writeAndFlush(part, promise: written)
        try await withTaskCancellationHandler {
            try await written.futureResult.get()
        } onCancel: {
            channel.close(promise: nil)
        }
    }

    /// Sends `body` in chunks, then the end of the request (nothing when `open` sent the end with the head).
    func send(_ body: OverlayRequestBody) async throws {
        if endedWithHead { return }
        try await Self.send(body, on: channel)
    }

    /// Sends `body` in chunks on `channel`, each once the one before was taken, then the end of the request.
    static func send(_ body: OverlayRequestBody, on channel: any Channel) async throws {
        switch body {
        case .none:
            break
        case .data(let data):
            var offset = data.startIndex
            while offset < data.endIndex {
                try Task.checkCancellation()
                let end = min(offset + Self.chunkSize, data.endIndex)
                try await write(.body(.byteBuffer(ByteBuffer(bytes: data[offset..<end]))), on: channel)
                offset = end
            }
        case .stream(let box):
            let stream = box.stream
            stream.open()
            defer { stream.close() }
            var chunk = [UInt8](repeating: 0, count: Self.chunkSize)
            while true {
                try Task.checkCancellation()
                let count = chunk.withUnsafeMutableBufferPointer { stream.read($0.baseAddress!, maxLength: $0.count) }
                if count < 0 {
                    throw OverlayURLError.make(
                        code: "body_unreadable",
                        reason: "the request body could not be read",
                        url: nil
                    )
                }
                if count == 0 { break }
                try await write(.body(.byteBuffer(ByteBuffer(bytes: chunk[0..<count]))), on: channel)
            }
        }
        try await write(.end(nil), on: channel)
    }

    /// The next part of the response, `nil` after its end. Cancelling the waiting task closes the circuit.
    func next() async throws -> HTTPClientResponsePart? {
        let promise = channel.eventLoop.makePromise(of: HTTPClientResponsePart?.self)
        let reader = self.reader
        channel.eventLoop.execute { reader.value.next(promise) }
        return try await withTaskCancellationHandler {
            try await promise.futureResult.get()
        } onCancel: {
            self.close()
        }
    }

    func close() {
        channel.close(promise: nil)
    }
}

/// A request body as URLSession hands it to a protocol: none, bytes in memory, or a stream (upload tasks).
enum OverlayRequestBody: Sendable {
    case none
    case data(Data)
    case stream(StreamBox)

    /// An `InputStream` is read by one task only, start to end.
    final class StreamBox: @unchecked Sendable {
        let stream: InputStream
        init(_ stream: InputStream) { self.stream = stream }
    }

    init(_ request: URLRequest) {
        if let data = request.httpBody, !data.isEmpty {
            self = .data(data)
        } else if let stream = request.httpBodyStream {
            self = .stream(StreamBox(stream))
        } else {
            self = .none
        }
    }
}
