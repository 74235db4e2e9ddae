import ILSFabric
@_spi(CustomByteBufferAllocator) import NIOCore
import NIOEmbedded
import Synchronization
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// `HTTP2FrameAligner` hands the HTTP/2 handler whole frames only, so swift-nio-http2's frame decoder, which keeps one
/// growing buffer for a connection's life, never holds more than one batch however the peer's bytes are split.
@Suite("HTTP/2 frame alignment in front of the decoder")
struct HTTP2FrameAlignerTests {
    static let maximumFrame = 128 * 1024
    static let preface = Array("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".utf8)

    @Test("every read the decoder gets is whole frames, at most two per input read, and no byte is lost or reordered")
    func wholeFramesOnly() throws {
        // A small maximum frame keeps this quick under the sanitizers; the aligner's logic does not depend on it.
        let maximumFrame = 4096
        var rng = SplitMix(seed: 7)
        for round in 0..<16 {
            let preface = round.isMultiple(of: 2)
            let (stream, frameEnds) = Self.frames(count: 80, maximum: maximumFrame, rng: &rng, preface: preface)
            let events = EventRecorder()
            let channel = EmbeddedChannel(handlers: [
                HTTP2FrameAligner(expectsPreface: preface, maximumFrameSize: maximumFrame), events,
            ])
            let prefaceEnd = preface ? 24 : 0
            var received = ByteBuffer()
            var reads: [ByteBuffer] = []
            for piece in Self.split(stream, rng: &rng, largest: round < 8 ? 16 : 3 * maximumFrame) {
                try channel.writeInbound(piece)
                var forwarded = 0
                while let read = try channel.readInbound(as: ByteBuffer.self) {
                    reads.append(read)
                    forwarded += 1
                }
                // At most: the preface, the held frame completed, and the rest of the piece's whole frames; between
                // the last two a read-complete, so the decoder's DATA slices are taken before its next append.
                #expect(forwarded <= 3, "a piece was handed on in \(forwarded) reads (round \(round))")
                let log = events.take()
                if log.hasSuffix("RR") { Issue.record("two reads without a read-complete between (round \(round))") }
            }
            for var read in reads {
                let start = received.readableBytes
                received.writeBuffer(&read)
                let end = received.readableBytes
                if end <= prefaceEnd { continue }  // the preface goes on as it comes
                #expect(
                    start == prefaceEnd || frameEnds.contains(start),
                    "a read starts inside a frame (round \(round))"
                )
                #expect(frameEnds.contains(end), "a read ends inside a frame (round \(round))")
            }
            #expect(received == ByteBuffer(bytes: stream))
            _ = try channel.finish()
        }
    }

    @Test("a frame longer than the announced maximum, and everything after it, passes through at once")
    func oversizedFramePassesThrough() throws {
        var bytes = Self.frame(type: 4, length: 0)
        bytes += Self.frame(type: 0xEE, length: Self.maximumFrame + 1).prefix(9 + 1000)
        let channel = EmbeddedChannel(handler: HTTP2FrameAligner(expectsPreface: false))
        try channel.writeInbound(ByteBuffer(bytes: bytes.prefix(5)))
        #expect(try channel.readInbound(as: ByteBuffer.self) == nil)  // half a header: held
        try channel.writeInbound(ByteBuffer(bytes: bytes.dropFirst(5)))
        var received: [UInt8] = []
        while let read = try channel.readInbound(as: ByteBuffer.self) { received += read.readableBytesView }
        #expect(received == bytes)  // nothing held back for the HTTP/2 handler to reject
        try channel.writeInbound(ByteBuffer(bytes: [1, 2, 3]))
        #expect(try channel.readInbound(as: ByteBuffer.self) == ByteBuffer(bytes: [1, 2, 3]))
        _ = try channel.finish()
    }

    /// A peer that never lets a read end on a frame boundary: swift-nio-http2's decoder alone appends each read at
    /// its write index and only resets when empty, so its buffer would grow with every byte of the connection (to
    /// about 16 MiB here). Checked through the allocator of the bytes the decoder is given, which its buffer inherits.
    @Test("the HTTP/2 decoder's buffer stays within one batch under reads that never end on a frame boundary")
    func decoderBufferStaysBounded() throws {
        var rng = SplitMix(seed: 11)
        var stream = Self.preface
        stream += Self.frame(type: 4, length: 0)  // SETTINGS
        stream += Self.frame(type: 4, length: 0, flags: 1)  // ACK of the server's: its 128 KiB frame size applies
        while stream.count < 4 << 20 {
            stream += Self.frame(type: 0xEE, length: Int.random(in: 1...100_000, using: &rng))  // extension: ignored
        }
        var reads: [ByteBuffer] = []
        var offset = 0
        while offset < stream.count {
            // Reads of 150–200 kB and frames of up to 100 kB: a read almost never ends on a frame boundary.
            let length = min(stream.count - offset, Int.random(in: 150_000...200_000, using: &rng))
            var read = TrackingAllocator.allocator.buffer(capacity: length)
            read.writeBytes(stream[offset..<(offset + length)])
            reads.append(read)
            offset += length
        }
        let channel = EmbeddedChannel()
        try channel.pipeline.syncOperations.configureFabricHTTP2(mode: .server)
        try channel.connect(to: SocketAddress(ipAddress: "127.0.0.1", port: 1)).wait()
        TrackingAllocator.largest.store(0, ordering: .relaxed)
        for read in reads {
            try channel.writeInbound(read)
        }
        #expect(channel.isActive, "the HTTP/2 handler refused the stream")
        let largest = TrackingAllocator.largest.load(ordering: .relaxed)
        #expect(largest > 0, "the decoder's buffer did not come from the tracked allocator: the test measures nothing")
        #expect(largest <= 256 * 1024, "decoder buffer grew to \(largest) bytes")
        _ = try? channel.finish()
    }

    // MARK: - Helpers

    /// Logs reads as `R` and read-completes as `C` and passes both on.
    final class EventRecorder: ChannelInboundHandler, @unchecked Sendable {
        typealias InboundIn = ByteBuffer
        private var log = ""

        func channelRead(context: ChannelHandlerContext, data: NIOAny) {
            log += "R"
            context.fireChannelRead(data)
        }

        func channelReadComplete(context: ChannelHandlerContext) {
            log += "C"
            context.fireChannelReadComplete()
        }

        func take() -> String {
            defer { log = "" }
            return log
        }
    }

    static func frame(type: UInt8, length: Int, flags: UInt8 = 0) -> [UInt8] {
        var bytes: [UInt8] = [UInt8(length >> 16 & 0xFF), UInt8(length >> 8 & 0xFF), UInt8(length & 0xFF), type, flags]
        bytes += [0, 0, 0, 0]
        bytes += [UInt8](repeating: type, count: length)
        return bytes
    }

    /// Frames of random sizes (many small, some up to the maximum), optionally after a client preface; returns the
    /// bytes and the offset where each frame (and the preface) ends.
    static func frames(count: Int, maximum: Int, rng: inout SplitMix, preface: Bool) -> ([UInt8], Set<Int>) {
        var bytes = preface ? Self.preface : []
        var ends: Set<Int> = [bytes.count]
        for _ in 0..<count {
            let length =
                Bool.random(using: &rng)
                ? Int.random(in: 0...64, using: &rng) : Int.random(in: 0...maximum, using: &rng)
            bytes += frame(type: UInt8.random(in: 0...9, using: &rng), length: length)
            ends.insert(bytes.count)
        }
        return (bytes, ends)
    }

    static func split(_ bytes: [UInt8], rng: inout SplitMix, largest: Int) -> [ByteBuffer] {
        var pieces: [ByteBuffer] = []
        var offset = 0
        while offset < bytes.count {
            let length = min(bytes.count - offset, Int.random(in: 1...largest, using: &rng))
            pieces.append(ByteBuffer(bytes: bytes[offset..<(offset + length)]))
            offset += length
        }
        return pieces
    }
}

/// A `ByteBufferAllocator` that remembers the largest block it was asked for.
enum TrackingAllocator {
    static let largest = Atomic<Int>(0)

    static let allocator = ByteBufferAllocator(
        allocate: { size in
            TrackingAllocator.note(Int(size))
            return malloc(size)
        },
        reallocate: { pointer, _, size in
            TrackingAllocator.note(Int(size))
            return realloc(pointer, size)
        },
        deallocate: { free($0) },
        copy: { destination, source, count in destination.copyMemory(from: source, byteCount: Int(count)) }
    )

    static func note(_ size: Int) {
        var current = largest.load(ordering: .relaxed)
        while size > current {
            let (exchanged, original) = largest.compareExchange(expected: current, desired: size, ordering: .relaxed)
            if exchanged { return }
            current = original
        }
    }
}

/// A small seeded generator, so a failure replays.
struct SplitMix: RandomNumberGenerator {
    var state: UInt64
    init(seed: UInt64) { state = seed }
    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}
