package import ILSCore
package import ILSCrypto
package import NIOCore

/// The established half of an end-to-end handler: plaintext out becomes sealed, framed records (`u32 length ‖
/// record`, ready for the wire), framed records in become plaintext. Shared by both ends.
///
/// Each record is sealed straight from the plaintext buffer into its own wire buffer (one pass, no intermediate
/// arrays) and opened straight into the plaintext buffer handed up.
package struct E2ERecordLayer {
    let session: E2ESession

    package init(session: E2ESession) {
        self.session = session
    }

    /// Seals `plaintext` as one or more framed records (at most `RecordLimits.maximumPlaintext` each) and hands each
    /// to `emit`, the last one with `isLast` set. An empty `plaintext` still makes one record (the FINAL one).
    package func seal(
        _ plaintext: ByteBuffer,
        allocator: ByteBufferAllocator,
        final: Bool = false,
        emit: (ByteBuffer, _ isLast: Bool) -> Void
    ) {
        var remaining = plaintext
        repeat {
            let length = min(remaining.readableBytes, RecordLimits.maximumPlaintext)
            let chunk = remaining.readSlice(length: length)!
            let isLast = remaining.readableBytes == 0
            let sealedLength = length + E2ERecord.overhead
            var record = allocator.buffer(capacity: 4 + sealedLength)
            record.writeInteger(UInt32(sealedLength))
            chunk.withUnsafeReadableBytes { input in
                _ = record.writeWithUnsafeMutableBytes(minimumWritableBytes: sealedLength) { output in
                    session.sender.seal(
                        input,
                        into: UnsafeMutableRawBufferPointer(rebasing: output.prefix(sealedLength)),
                        final: final && isLast
                    )
                    return sealedLength
                }
            }
            emit(record, isLast)
        } while remaining.readableBytes > 0
    }

    /// Opens one record (a frame body from `FrameDecoder`).
    package func open(_ record: ByteBuffer, allocator: ByteBufferAllocator) throws(ILSError) -> (
        ByteBuffer, final: Bool
    ) {
        guard record.readableBytes >= E2ERecord.overhead else { throw SecretStream.invalidRecord }
        let length = record.readableBytes - E2ERecord.overhead
        var plaintext = allocator.buffer(capacity: max(length, 1))
        var result: Result<Bool, ILSError> = .success(false)
        record.withUnsafeReadableBytes { input in
            _ = plaintext.writeWithUnsafeMutableBytes(minimumWritableBytes: length) { output in
                do throws(ILSError) {
                    result = .success(
                        try session.receiver.open(
                            input,
                            into: UnsafeMutableRawBufferPointer(rebasing: output.prefix(length))
                        )
                    )
                } catch {
                    result = .failure(error)
                }
                return length
            }
        }
        return (plaintext, try result.get())
    }

    /// A handshake message, framed for the wire.
    static func frame(_ message: [UInt8], allocator: ByteBufferAllocator) -> ByteBuffer {
        var buffer = allocator.buffer(capacity: 4 + message.count)
        buffer.writeInteger(UInt32(message.count))
        buffer.writeBytes(message)
        return buffer
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
