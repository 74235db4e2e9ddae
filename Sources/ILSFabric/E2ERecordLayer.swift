import ILSCore
import ILSCrypto
import NIOCore

/// The established half of an end-to-end handler: plaintext out becomes sealed records, sealed records in become
/// plaintext. Shared by both ends.
struct E2ERecordLayer {
    let session: E2ESession

    /// Seals `plaintext` as one or more records (at most `RecordLimits.maximumPlaintext` each).
    func seal(_ plaintext: ByteBuffer, allocator: ByteBufferAllocator, final: Bool = false) -> [ByteBuffer] {
        var remaining = plaintext
        var records: [ByteBuffer] = []
        repeat {
            let length = min(remaining.readableBytes, RecordLimits.maximumPlaintext)
            let chunk = remaining.readBytes(length: length) ?? []
            let isLast = remaining.readableBytes == 0
            let sealed = session.sender.seal(chunk, final: final && isLast)
            var buffer = allocator.buffer(capacity: sealed.count)
            buffer.writeBytes(sealed)
            records.append(buffer)
        } while remaining.readableBytes > 0
        return records
    }

    func open(_ record: ByteBuffer) throws(ILSError) -> (ByteBuffer, final: Bool) {
        let (plaintext, final) = try session.receiver.open(Array(record.readableBytesView))
        return (ByteBuffer(bytes: plaintext), final)
    }
}

/// Writes buffered while the handshake runs, released in order once it completes.
struct PendingWrites {
    private var writes: [(ByteBuffer, EventLoopPromise<Void>?)] = []
    private(set) var flushRequested = false

    mutating func append(_ buffer: ByteBuffer, _ promise: EventLoopPromise<Void>?) {
        writes.append((buffer, promise))
    }

    mutating func requestFlush() { flushRequested = true }

    mutating func drain() -> (writes: [(ByteBuffer, EventLoopPromise<Void>?)], flush: Bool) {
        defer {
            writes = []
            flushRequested = false
        }
        return (writes, flushRequested)
    }

    mutating func fail(_ error: any Error) {
        for (_, promise) in writes { promise?.fail(error) }
        writes = []
    }
}
