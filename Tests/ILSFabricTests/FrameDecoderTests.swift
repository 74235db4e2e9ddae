import ILSFabric
@_spi(CustomByteBufferAllocator) import NIOCore
import NIOEmbedded
import Synchronization
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// `FrameDecoder` passes whole frames on as slices of what arrived and copies only an incomplete frame it holds, so
/// a circuit waiting for the rest of a record never keeps the buffer it arrived in (on a real circuit, the HTTP/2
/// decoder's whole read buffer) alive.
@Suite("Circuit frame decoding")
struct FrameDecoderTests {
    /// Counts the live allocations made through it.
    enum LiveAllocator {
        static let live = Atomic<Int>(0)
        static let allocator = ByteBufferAllocator(
            allocate: { size in
                LiveAllocator.live.add(1, ordering: .relaxed)
                return malloc(size)
            },
            reallocate: { pointer, _, size in realloc(pointer, size) },
            deallocate: { pointer in
                LiveAllocator.live.subtract(1, ordering: .relaxed)
                free(pointer)
            },
            copy: { destination, source, count in destination.copyMemory(from: source, byteCount: Int(count)) }
        )
    }

    static func frame(_ body: [UInt8]) -> [UInt8] {
        let length = UInt32(body.count)
        return [UInt8(length >> 24), UInt8(length >> 16 & 0xFF), UInt8(length >> 8 & 0xFF), UInt8(length & 0xFF)] + body
    }

    @Test(
        "a held incomplete frame does not keep the buffer it arrived in; whole frames and the completed one come out intact"
    )
    func heldFrameIsDetached() throws {
        let channel = EmbeddedChannel(handler: ByteToMessageHandler(FrameDecoder()))
        defer { _ = try? channel.finish(acceptAlreadyClosed: true) }
        let first = [UInt8](repeating: 1, count: 100)
        let second = [UInt8](repeating: 2, count: 1000)
        let wire = Self.frame(first) + Self.frame(second)
        let split = 4 + first.count + 4 + 10  // the first frame, then the second's header and 10 bytes of it

        for headerOnly in [false, true] {
            let cut = headerOnly ? 4 + first.count + 2 : split
            do {
                var arrived = LiveAllocator.allocator.buffer(capacity: 256 * 1024)
                arrived.writeBytes(wire[..<cut])
                try channel.writeInbound(arrived)
            }
            let whole = try #require(try channel.readInbound(as: ByteBuffer.self))
            #expect(Array(whole.readableBytesView) == first)
            #expect(try channel.readInbound(as: ByteBuffer.self) == nil)
            _ = consume whole
            #expect(LiveAllocator.live.load(ordering: .relaxed) == 0, "the held frame keeps the 256 KiB buffer alive")

            try channel.writeInbound(ByteBuffer(bytes: wire[cut...]))
            let completed = try #require(try channel.readInbound(as: ByteBuffer.self))
            #expect(Array(completed.readableBytesView) == second)
        }
    }

    @Test("frames split at every possible point come out whole and in order")
    func everySplit() throws {
        let bodies = [[UInt8](repeating: 7, count: 3), [], [UInt8](repeating: 9, count: 300)]
        let wire = bodies.flatMap(Self.frame)
        for cut in 0...wire.count {
            let channel = EmbeddedChannel(handler: ByteToMessageHandler(FrameDecoder()))
            try channel.writeInbound(ByteBuffer(bytes: wire[..<cut]))
            try channel.writeInbound(ByteBuffer(bytes: wire[cut...]))
            var out: [[UInt8]] = []
            while let frame = try channel.readInbound(as: ByteBuffer.self) {
                out.append(Array(frame.readableBytesView))
            }
            #expect(out == bodies, "split at \(cut)")
            _ = try channel.finish(acceptAlreadyClosed: true)
        }
    }
}
