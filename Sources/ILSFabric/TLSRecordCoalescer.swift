public import NIOCore

/// Sits between `NIOSSLHandler` and the HTTP/2 handler on every overlay connection and hands the TLS handler the
/// writes of one flush as few buffers as it can: consecutive small writes are copied into one buffer of up to
/// `recordLimit` bytes.
///
/// swift-nio-ssl seals each buffered write as its own TLS record (one `SSL_write` per write), and swift-nio-http2
/// writes every frame as two buffers, its 9-byte header and its payload. So without this every DATA frame was two
/// records: a 9-byte one (plus its 22 bytes of header and tag) and the payload's, each sealed at one end and opened at
/// the other, on both legs of a circuit and both ways. One request through the app's path crossed eight such ends.
/// Merging them costs one copy of at most one record's plaintext per flush (1 KiB for a small request; nothing above
/// `recordLimit`, where the header is the only extra record and the payload already spans several).
///
/// Order is kept: a write too large to merge goes out on its own, after the run before it. Nothing is held past a
/// flush, a close or the handler's removal (what was written is passed on then, so the TLS handler fails or sends
/// it exactly as it would have), so this changes only how the bytes are cut into records, never which bytes go out
/// or when.
public final class TLSRecordCoalescer: ChannelOutboundHandler, RemovableChannelHandler {
    public typealias OutboundIn = ByteBuffer
    public typealias OutboundOut = ByteBuffer

    /// TLS's largest record plaintext (RFC 8446 §5.1, RFC 5246 §6.2.1): merging beyond it would only be cut again.
    public static let recordLimit = 16_384

    private let recordLimit: Int
    private var pending: [(data: ByteBuffer, promise: EventLoopPromise<Void>?)] = []

    public init(recordLimit: Int = TLSRecordCoalescer.recordLimit) {
        precondition(recordLimit > 0)
        self.recordLimit = recordLimit
        pending.reserveCapacity(4)
    }

    public func write(context: ChannelHandlerContext, data: NIOAny, promise: EventLoopPromise<Void>?) {
        pending.append((unwrapOutboundIn(data), promise))
    }

    public func flush(context: ChannelHandlerContext) {
        passOn(context: context)
        context.flush()
    }

    public func close(context: ChannelHandlerContext, mode: CloseMode, promise: EventLoopPromise<Void>?) {
        passOn(context: context)
        context.close(mode: mode, promise: promise)
    }

    public func handlerRemoved(context: ChannelHandlerContext) {
        passOn(context: context)
    }

    /// Writes what is pending to the next handler, merging each run of consecutive writes that fits one record.
    private func passOn(context: ChannelHandlerContext) {
        guard !pending.isEmpty else { return }
        // Swapped out, not copied: a promise failed on the way may write again, and that write must wait for the
        // next flush rather than change the array being walked.
        var writes: [(data: ByteBuffer, promise: EventLoopPromise<Void>?)] = []
        swap(&writes, &pending)
        defer {
            writes.removeAll(keepingCapacity: true)
            if pending.isEmpty { pending = writes }  // the storage back, so a flush allocates no array
        }
        var start = 0
        while start < writes.count {
            var end = start + 1
            var size = writes[start].data.readableBytes
            while end < writes.count, size + writes[end].data.readableBytes <= recordLimit {
                size += writes[end].data.readableBytes
                end += 1
            }
            if end - start == 1 {
                context.write(wrapOutboundOut(writes[start].data), promise: writes[start].promise)
            } else {
                var merged = context.channel.allocator.buffer(capacity: size)
                var promises: [EventLoopPromise<Void>] = []
                for index in start..<end {
                    merged.writeImmutableBuffer(writes[index].data)
                    if let promise = writes[index].promise { promises.append(promise) }
                }
                context.write(wrapOutboundOut(merged), promise: Self.combined(promises, on: context.eventLoop))
            }
            start = end
        }
    }

    /// One promise that completes all of `promises` (nil when there are none, the one itself when there is one).
    private static func combined(
        _ promises: [EventLoopPromise<Void>],
        on loop: any EventLoop
    ) -> EventLoopPromise<Void>? {
        switch promises.count {
        case 0: return nil
        case 1: return promises[0]
        default:
            let promise = loop.makePromise(of: Void.self)
            promise.futureResult.whenComplete { result in
                for each in promises { each.completeWith(result) }
            }
            return promise
        }
    }
}
