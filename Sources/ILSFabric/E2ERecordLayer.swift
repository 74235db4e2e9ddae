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

    /// Seals `plaintext` as one or more framed records (at most `RecordLimits.sealedPlaintext` each) and hands each
    /// to `emit`, the last one with `isLast` set. An empty `plaintext` still makes one record (the FINAL one).
    package func seal(
        _ plaintext: ByteBuffer,
        allocator: ByteBufferAllocator,
        final: Bool = false,
        emit: (ByteBuffer, _ isLast: Bool) -> Void
    ) {
        var remaining = plaintext
        repeat {
            let length = min(remaining.readableBytes, RecordLimits.sealedPlaintext)
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

    /// Seals `plaintext` and writes the framed records through `context` (a handler whose outbound type is
    /// `ByteBuffer`), `promise` completing with the last.
    package func write(
        _ plaintext: ByteBuffer,
        final: Bool = false,
        promise: EventLoopPromise<Void>?,
        to context: ChannelHandlerContext
    ) {
        seal(plaintext, allocator: context.channel.allocator, final: final) { record, isLast in
            context.write(NIOAny(record), promise: isLast ? promise : nil)
        }
    }

    /// Whether this circuit's records have the CANCEL record (suite 4).
    package var hasCancel: Bool { session.sender.suite.hasCancel }

    /// Whether the peer's last record was CANCEL.
    package var peerCancelled: Bool { session.receiver.cancelled }

    /// After `open`: the count the record acknowledged if it was an ACK (its plaintext is not the stream's).
    package var acknowledged: UInt64? { session.receiver.acknowledged }

    package var isResumable: Bool { session.sender.suite.isResumable }

    /// What the circuit under the handler learns at the handshake's end.
    package var establishedEvent: CircuitRecordsEvent {
        .established(secrets: session.resume, peerID: session.peer.id)
    }

    /// Writes the framed ACK record for `count` through `context` and flushes (only with a resumable suite). An ACK
    /// may follow the direction's FINAL record: the peer's direction can still be sending.
    package func writeAck(_ count: UInt64, to context: ChannelHandlerContext, flush: Bool = true) {
        guard session.sender.suite.isResumable else { return }
        let length = E2ERecord.overhead + 8
        var record = context.channel.allocator.buffer(capacity: 4 + length)
        record.writeInteger(UInt32(length))
        _ = record.writeWithUnsafeMutableBytes(minimumWritableBytes: length) { output in
            session.sender.sealAck(count, into: UnsafeMutableRawBufferPointer(rebasing: output.prefix(length)))
            return length
        }
        if flush {
            context.writeAndFlush(NIOAny(record), promise: nil)
        } else {
            context.write(NIOAny(record), promise: nil)
        }
    }

    /// The peer's FINAL was opened: acknowledges it at once with every record before it (`acknowledgeAll`), so the
    /// peer's end settles, then tells the circuit under the handler.
    func peerFinished(acknowledging inbound: inout InboundRecords, to context: ChannelHandlerContext) {
        if let count = inbound.acknowledgeAll(resumable: isResumable) { writeAck(count, to: context) }
        context.triggerUserOutboundEvent(CircuitRecordsEvent.peerFinished, promise: nil)
    }

    /// Writes the framed CANCEL record through `context` (only where `hasCancel`).
    package func writeCancel(to context: ChannelHandlerContext, promise: EventLoopPromise<Void>?) {
        var record = context.channel.allocator.buffer(capacity: 4 + E2ERecord.overhead)
        record.writeInteger(UInt32(E2ERecord.overhead))
        _ = record.writeWithUnsafeMutableBytes(minimumWritableBytes: E2ERecord.overhead) { output in
            session.sender.sealCancel(into: UnsafeMutableRawBufferPointer(rebasing: output.prefix(E2ERecord.overhead)))
            return E2ERecord.overhead
        }
        context.write(NIOAny(record), promise: promise)
    }

    /// Opens one record (a frame body from `FrameDecoder`).
    package func open(_ record: ByteBuffer, allocator: ByteBufferAllocator) throws(ILSError) -> (
        ByteBuffer, final: Bool
    ) {
        guard record.readableBytes >= E2ERecord.overhead else { throw E2ERecord.invalidRecord }
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

/// The plaintext written since the last flush, sealed as one record when the flush comes.
///
/// The layers above write a message in pieces: an HTTP response as its head, its body and its end, an SSE event as
/// its chunk-size line, its data and a CRLF. Sealed write by write, one response or event was three records (one
/// of them often empty), so three DATA frames through every hop, three seals and three opens. Nothing written
/// leaves before a flush anyway, so small writes wait here for it; a write of `sealedAlone` bytes or more (bulk
/// data) is sealed on its own at once, without being copied, after whatever waits. Holds nothing between flushes.
package struct RecordBatch {
    /// Writes at least this large are sealed as they come.
    package static let sealedAlone = 16 * 1024

    /// Plaintext to seal as one record, and the promise of its write.
    package typealias Sealable = (plaintext: ByteBuffer, promise: EventLoopPromise<Void>?)

    private var plaintext: ByteBuffer?
    /// Completes when the batch's record has been written; later writes' promises are chained to it.
    private var promise: EventLoopPromise<Void>?

    package init() {}

    /// Adds a write; returns what must be sealed now, in order: the waiting batch, then a large write on its own.
    /// (Returned, not sealed from in here: writing a record can call back into the handler that owns the batch.)
    package mutating func add(
        _ buffer: ByteBuffer,
        promise: EventLoopPromise<Void>?,
        allocator: ByteBufferAllocator
    ) -> (waiting: Sealable?, alone: Sealable?) {
        let size = buffer.readableBytes
        if size >= Self.sealedAlone {
            return (drain(), (buffer, promise))
        }
        if size == 0, plaintext == nil {
            // Nothing to seal (an encoder's empty end of message); only a promise needs its place in the order.
            return (nil, promise.map { (buffer, $0) })
        }
        let waiting = (plaintext?.readableBytes ?? 0) + size > RecordLimits.sealedPlaintext ? drain() : nil
        if plaintext == nil {
            // Room for a response head and a small body without growing (a growth is a second allocation and copy).
            plaintext = allocator.buffer(capacity: max(size, 4096))
        }
        plaintext!.writeImmutableBuffer(buffer)
        if let promise {
            if let held = self.promise {
                held.futureResult.cascade(to: promise)
            } else {
                self.promise = promise
            }
        }
        return (waiting, nil)
    }

    /// Takes what waits, to be sealed as one record.
    package mutating func drain() -> Sealable? {
        guard let plaintext else { return nil }
        let promise = self.promise
        self.plaintext = nil
        self.promise = nil
        return (plaintext, promise)
    }

    /// Drops what waits (the circuit closed before a flush), failing its writes as NIO fails unflushed writes.
    package mutating func fail(_ error: any Error) {
        let promise = self.promise
        plaintext = nil
        self.promise = nil
        promise?.fail(error)
    }
}

/// Writes buffered while the handshake runs, released in order once it completes, each with whether a flush came
/// after it (so they are sealed into the same records they would have been had the circuit been ready).
struct PendingWrites {
    private var writes: [(buffer: ByteBuffer, promise: EventLoopPromise<Void>?, flushAfter: Bool)] = []

    mutating func append(_ buffer: ByteBuffer, _ promise: EventLoopPromise<Void>?) {
        writes.append((buffer, promise, false))
    }

    mutating func requestFlush() {
        if !writes.isEmpty { writes[writes.count - 1].flushAfter = true }
    }

    mutating func drain() -> [(buffer: ByteBuffer, promise: EventLoopPromise<Void>?, flushAfter: Bool)] {
        defer { writes = [] }
        return writes
    }

    mutating func fail(_ error: any Error) {
        for write in writes { write.promise?.fail(error) }
        writes = []
    }
}

/// What an end-to-end handler has opened and the layer above has not asked for yet, and the ACKs for what it took.
///
/// A resumable circuit's path reads freely (`CircuitPathHandler`): the peer's ACKs must be read even while the layer
/// above reads nothing (the gateway's HTTP server reads no request while it writes a response, and a download's
/// ACKs come from the device then). So records are opened as they come, and what the layer above has not asked for
/// (`read`) waits here, in order with the direction's end. The flow control that the HTTP/2 window gave is the
/// peer's retention instead: an end acknowledges only records handed up, and a sender keeps at most
/// `CircuitRetention.maximumPerCircuit` unacknowledged; a peer that sends past that is refused (`overflowed`).
///
/// Without a resumable suite the path reads only when asked (as before): the queue holds at most one read's worth
/// and nothing is acknowledged.
struct InboundRecords {
    enum Item {
        /// A data record's plaintext (possibly empty); `final` if it was the peer's FINAL.
        case record(ByteBuffer, final: Bool)
        /// END_STREAM without FINAL.
        case unsealedEnd
        /// The gateway's CANCEL: it cut the answer short on purpose (suite 5).
        case cancelled
    }

    private var queue = CircularBuffer<Item>()
    private var queuedBytes = 0
    /// The layer above asked for a read that no read-complete has answered.
    private var wanted = false
    /// Records handed up (an ACK needs no handing: counted when opened), and how many the last ACK covered.
    private var delivered: UInt64 = 0
    private var acknowledged: UInt64 = 0
    private var unacknowledgedBytes = 0
    /// A record was handed up since the last ACK (ACKs alone are not acknowledged).
    private var pending = false
    private var ackTimer: Scheduled<Void>?

    /// An ACK goes at once after `ackEveryBytes` handed up (or `acksPerAck` of the peer's ACKs); it is owed after
    /// `ackEveryRecords` data records or `owedAfterBytes`, and goes with this end's next data or alone
    /// `owedAckDelay` later; and `ackDelay` after the first record not yet acknowledged (docs/protocol.md).
    static let ackEveryRecords: UInt64 = 16
    /// 768 KiB: at 256 KiB (until 2026-12-06) a 256 MiB download made 1,024 ACKs, each a write, a relay hop and a
    /// wake-up in three processes, and cost 4–10 % of its throughput where CPU bounds it; with 1 MiB the bench's
    /// download was as fast as suite 4's, with the same CPU (docs/benchmarks.md). Not 1 MiB: a sender of an earlier
    /// release keeps 1 MiB, counted as the memory its records take, so it stops after 16 full records (1,048,240
    /// bytes); it gets this ACK at the 13th, before it stops, and waits for no timer.
    static let ackEveryBytes = 768 * 1024
    /// 256 KiB: what a sender's bound must let go unacknowledged (protocol.md). A sender that stops between this and
    /// `ackEveryBytes` (ils's least bound, 640 KiB) waits at most `owedAckDelay` for its ACK, not `ackDelay`.
    static let owedAfterBytes = 256 * 1024
    static let ackDelay: TimeAmount = .seconds(1)
    /// An owed ACK waits this long for data of this end's to go with (`takeOwed`): in an exchange of requests and
    /// answers it then shares their write, TLS record and relay hop instead of costing its own (a keep-alive request
    /// through a resumable circuit took 6–16 % longer than through one of suite 4). Due by `ackEveryBytes`, or by the
    /// peer's ACKs, it goes at once: that is what frees the peer's bound.
    static let owedAckDelay: TimeAmount = .milliseconds(10)
    /// An ACK is owed (by its record count or `owedAfterBytes`) and waits for data to go with (`owedAckDelay`).
    private var owed = false
    /// What may wait here: the most a peer may send unacknowledged, plus one record. Each item counts its
    /// plaintext and `itemOverhead`, about what it costs in memory beyond its bytes.
    static let limit = CircuitRetention.maximumPerCircuit + RecordLimits.maximumPlaintext + 64
    static let itemOverhead = 64

    /// Whether records wait for the layer above to ask: only on a resumable circuit over a `CircuitChannel`, whose
    /// path reads freely. Anywhere else the channel below reads only when asked, and records go up as they open.
    private var gated: Bool

    init(gated: Bool = false) {
        self.gated = gated
    }

    /// Whether what waits is beyond what a peer may send unacknowledged.
    var overflowed: Bool { queuedBytes > Self.limit }

    /// The handshake is done on `channel` with `layer`.
    mutating func established(layer: E2ERecordLayer, channel: any Channel) {
        gated = layer.isResumable && channel is CircuitChannel
    }

    /// An ACK record was opened. ACKs are records too, kept by their sender until acknowledged: in a one-way flow
    /// (a download, an SSE stream) the receiving end sends only ACKs, so it must get ACKs back or its own fill its
    /// bound and stop it. Every `acksPerAck` of them make an ACK due; that ACK is one the peer counts in turn, so
    /// the exchange shrinks by that factor each way and never ping-pongs.
    mutating func openedAck() {
        delivered += 1  // numbered, so acknowledged with the rest; never a reason of its own (protocol.md)
        acksUnacknowledged += 1
        if acksUnacknowledged >= Self.acksPerAck { pending = true }
    }

    private var acksUnacknowledged = 0
    static let acksPerAck = 32
    /// Data records handed up since the last ACK: 16 of them make one due. The peer's ACKs are not counted here
    /// (they were, against protocol.md, so an ACK could make the next one due at a read that carried no data).
    private var dataUnacknowledged: UInt64 = 0

    /// A data record was opened: returns it to hand up now, or nil if it waits.
    mutating func opened(_ plaintext: ByteBuffer, final: Bool) -> Item? {
        enqueue(.record(plaintext, final: final))
    }

    /// The peer's END_STREAM without FINAL: in order after what waits.
    mutating func unsealedEnd() -> Item? { enqueue(.unsealedEnd) }

    /// The peer's CANCEL, in order after what waits.
    mutating func cancelled() -> Item? { enqueue(.cancelled) }

    private mutating func enqueue(_ item: Item) -> Item? {
        if !gated || (wanted && queue.isEmpty) {
            handedUp(item)
            return item
        }
        // What an item costs here whatever its size: a flood of empty records must meet the bound too.
        if case .record(let buffer, _) = item { queuedBytes += buffer.readableBytes + Self.itemOverhead }
        queue.append(item)
        return nil
    }

    private mutating func handedUp(_ item: Item) {
        guard case .record(let buffer, _) = item, !allCounted else { return }
        delivered += 1
        dataUnacknowledged += 1
        unacknowledgedBytes += buffer.readableBytes
        pending = true
    }

    /// The layer above asks for a read: what waited, all of it (then a read-complete), or nothing.
    mutating func readRequested() -> [Item] {
        wanted = true
        return drainAll()
    }

    /// Everything that waits (also at the circuit's close: handed up before it goes inactive, as NIO's channels do).
    mutating func drainAll() -> [Item] {
        guard !queue.isEmpty else { return [] }
        let items = Array(queue)
        queue.removeAll()
        queuedBytes = 0
        for item in items { handedUp(item) }
        return items
    }

    mutating func readCompleted() { wanted = false }

    /// Every record opened so far is counted, the ones still waiting included (`acknowledgeAll`).
    private var allCounted = false

    /// At the peer's FINAL: the count of every record opened, to acknowledge now (nil unless `resumable`). After a
    /// FINAL the peer sends only ACKs, so acknowledging what waits here gives it no room to send more data; its end
    /// settles without waiting on the layer above to read (`CircuitPathMachine.pathEndDue`).
    mutating func acknowledgeAll(resumable: Bool) -> UInt64? {
        guard resumable, !allCounted else { return nil }
        for item in queue { if case .record = item { delivered += 1 } }
        allCounted = true
        pending = true
        return acknowledgeNow()
    }

    /// The count to acknowledge now, if one is due (`layer` resumable); else arms the delayed ACK with `later`.
    mutating func ackDue(resumable: Bool, on eventLoop: any EventLoop, later: @escaping () -> Void) -> UInt64? {
        guard resumable, pending else { return nil }
        if unacknowledgedBytes >= Self.ackEveryBytes || acksUnacknowledged >= Self.acksPerAck {
            return acknowledgeNow()
        }
        if dataUnacknowledged >= Self.ackEveryRecords || unacknowledgedBytes >= Self.owedAfterBytes, !owed {
            owed = true
            ackTimer?.cancel()
            ackTimer = eventLoop.assumeIsolated().scheduleTask(in: Self.owedAckDelay, later)
        }
        if ackTimer == nil { ackTimer = eventLoop.assumeIsolated().scheduleTask(in: Self.ackDelay, later) }
        return nil
    }

    /// Whether an ACK is owed (it goes with this end's next data, or alone `owedAckDelay` later).
    var isOwed: Bool { owed }

    /// The ACK that is due and waits for data (`owedAckDelay`), to write just before the data this end flushes.
    mutating func takeOwed() -> UInt64? {
        owed ? acknowledgeNow() : nil
    }

    /// The count to acknowledge when the delayed ACK fires (nil if nothing new).
    mutating func acknowledgeNow() -> UInt64? {
        ackTimer?.cancel()
        ackTimer = nil
        owed = false
        guard pending else { return nil }
        pending = false
        acknowledged = delivered
        unacknowledgedBytes = 0
        dataUnacknowledged = 0
        acksUnacknowledged = 0
        return delivered
    }

    mutating func stop() {
        ackTimer?.cancel()
        ackTimer = nil
    }
}
