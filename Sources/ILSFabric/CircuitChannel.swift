public import ILSCrypto
import NIOConcurrencyHelpers
public import NIOCore
import NIOHTTP2

/// What the end-to-end handlers tell the circuit under them, as outbound user events.
public enum CircuitRecordsEvent: Sendable {
    /// The handshake is done: from the next frame on, every frame each way is a record, numbered from 0. `secrets` is
    /// set when the suite is resumable; `peerID` is the verified identity at the other end.
    case established(secrets: E2EResumeSecrets?, peerID: String)
    /// The frame being read was an ACK: the peer has opened `count` of our records.
    case acknowledged(UInt64)
    /// The peer's direction ended with its FINAL or CANCEL record.
    case peerFinished
}

/// How much a resumable circuit may keep of its own records that the peer has not acknowledged: per circuit, per
/// identity at the far end, and across every held circuit of the process (`RetentionBudget`). A circuit at its bound
/// stops being writable, so the proxy or the app stops reading what would fill it (the backend's answer, an upload):
/// memory is never unbounded.
public struct CircuitRetention: Sendable {
    /// How long a circuit whose path is lost is held for a new one. 0 ends it with the path, as before resumption.
    public var grace: TimeAmount
    public var perCircuit: Int
    public let budget: RetentionBudget

    /// 60 s: a phone's switch from Wi-Fi to cellular takes seconds; an iPad whose screen goes off suspends the app
    /// within seconds to minutes. A held circuit keeps its backend request (and its cost) going that long for a
    /// device that may not come back. docs/operations.md, "Resumption".
    public static let defaultGrace: TimeAmount = .seconds(60)
    /// 3 MiB: what is kept is also the circuit's window, and a record's ACK comes back through three processes (the
    /// device, the relay, the gateway), where suite 4's HTTP/2 windows are given back hop by hop. At 1 MiB a bulk
    /// download through a loaded 2-core machine ran at 0.88–0.93 of suite 4's, at 4 MiB 0.95–0.97
    /// (docs/benchmarks.md). Below `maximumPerCircuit` by 1 MiB: a write that reaches the bound goes on whole, and
    /// the proxy's writes can be two records (a body part and its chunk framing), while a receiver takes at most 4 MiB
    /// and one record. A device's circuits share `defaultPerIdentity` beyond `minimumPerCircuit` each.
    public static let defaultPerCircuit = 3 * 1024 * 1024
    /// The least a circuit keeps: 2.5 times what makes a receiver owe an ACK by bytes (`InboundRecords.owedAfterBytes`,
    /// 256 KiB). What is kept is counted as memory, each record at its buffer (NIO rounds it up to a power of two, so
    /// up to twice its bytes) plus `recordOverhead`: at this bound the receiver has 256 KiB, and owes an ACK (at most
    /// 10 ms later) before the sender stops, for records of 256 bytes and more; smaller ones make it owed by their
    /// count. A sender that stops first waits for the receiver's ACK of last resort, 1 s later, at every fill (with
    /// 64 KiB a download went at 64 KiB a second, measured; 512 KiB would stall records of 32,748–32,767 bytes). An
    /// ACK due at once (`InboundRecords.ackEveryBytes`, 768 KiB) needs a bound of about twice that: the default's.
    public static let minimumPerCircuit = 5 * InboundRecords.owedAfterBytes / 2
    /// The most any end may keep unacknowledged per circuit (a protocol constant: a receiver refuses a peer that
    /// sends more than this ahead of its ACKs, docs/protocol.md).
    public static let maximumPerCircuit = 4 * 1024 * 1024
    public static let defaultTotal = 256 * 1024 * 1024
    /// 32 MiB: what the circuits of one identity keep beyond `minimumPerCircuit` each, eight bulk transfers at the
    /// default bound. Without it a device with its circuits' cap open (`controller run --max-circuits-per-identity`)
    /// could make a gateway keep that many full bounds.
    public static let defaultPerIdentity = 32 * 1024 * 1024
    /// 64: the most circuits of one identity held at once (`RetentionBudget.heldPerIdentity`). An app has a handful
    /// of streams open, a browser behind a tunnel six connections per host; 64 leaves room for several of those,
    /// while one device that loses its path with its whole cap of 256 circuits open cannot make a gateway hold them
    /// all for a grace window (about 12,000 a minute at the defaults before, issue 49).
    public static let defaultHeldPerIdentity = 64

    /// The low watermark: a circuit stopped at `perCircuit` (its high watermark) is writable again once what it keeps
    /// is down to this, one owed ACK's worth (`InboundRecords.owedAfterBytes`, 256 KiB) below. Without it an ACK of a
    /// few small records made a circuit at its bound writable for one write, and every such ACK flipped writability
    /// twice through the whole pipeline (the proxy's backend reads with it). Not lower: the bound is also the
    /// circuit's window, and becoming writable only at half of it cost 7–10 % of a bulk download (docs/benchmarks.md).
    /// The peer owes an ACK for what lies above it, so a circuit stopped there always hears one.
    public var lowWatermark: Int { perCircuit - InboundRecords.owedAfterBytes }

    /// `perCircuit` is taken within `minimumPerCircuit`...`maximumPerCircuit`.
    public init(
        grace: TimeAmount = CircuitRetention.defaultGrace,
        perCircuit: Int = CircuitRetention.defaultPerCircuit,
        budget: RetentionBudget = RetentionBudget(limit: CircuitRetention.defaultTotal)
    ) {
        self.grace = grace
        self.perCircuit = min(max(perCircuit, Self.minimumPerCircuit), Self.maximumPerCircuit)
        self.budget = budget
    }

    /// The process-wide budget of `standard`.
    public static let sharedBudget = RetentionBudget(limit: defaultTotal)
    public static let standard = CircuitRetention(budget: sharedBudget)
}

/// The bytes the circuits of a process keep for resumption: in all, by the identity at each circuit's far end, and
/// what held circuits (their path lost) keep.
///
/// `limit` bounds held circuits hard: what they keep, counted from the moment they are held (what a circuit kept
/// while attached is carried in whole), never exceeds it. A circuit is held only if what it keeps fits under the
/// limit beside the others, and only while its identity holds fewer than `heldPerIdentity` circuits; else it is not
/// held at all and ends with its path (its backend request too; its device's resumption is refused). Why not evict
/// the oldest held circuit of the identity holding most instead: a held circuit is one a device is about to resume,
/// and an eviction would trade a circuit that has waited for one that just arrived; refusing the newcomer is
/// decided on the spot, costs no scan, and the per-identity cap already keeps one device from filling the total
/// alone. A held circuit reads its source (the backend's answer) only while it holds a reservation of one read's
/// worth (`writeReserve`) under the limit: the read it starts then always fits, so the limit holds even with every
/// held circuit mid-read (the bound was soft before: each circuit learned that the total was full only at its next
/// write, so 400 circuits of one device kept 12 times a 32 MiB total, issue 49).
///
/// `perIdentity` bounds what one identity's circuits keep beyond `CircuitRetention.minimumPerCircuit` each,
/// attached or held: a circuit that keeps less than that is never stopped by its identity, so each circuit can
/// always reach the bytes that make its peer's ACK due (and the ACK is what lets it go on: no circuit waits on
/// another's). One identity therefore makes a process keep at most `perIdentity`, or `minimumPerCircuit` per circuit
/// if that is more, plus a write per circuit.
public final class RetentionBudget: Sendable {
    public let limit: Int
    public let perIdentity: Int
    public let heldPerIdentity: Int

    /// What a held circuit reserves under `limit` to read once more from its source: the most one backend read
    /// becomes as records (64 KiB at most, `BackendPool`; its body parts, two if it spans the end of one of the
    /// backend's chunks, sealed into records whose buffers the allocator rounds up to powers of two, up to twice
    /// their bytes, plus `CircuitChannel.recordOverhead` each).
    public static let writeReserve = 2 * (64 * 1024 + 1024) + 4 * CircuitChannel.recordOverhead

    /// Why a circuit was not held.
    public enum Refusal: String, Sendable, CaseIterable {
        /// What it keeps does not fit under `limit` beside the other held circuits.
        case total
        /// Its identity holds `heldPerIdentity` circuits already.
        case identity
    }

    private struct Usage {
        var total = 0
        /// Only identities that keep something: an entry goes when its bytes come back to 0.
        var byIdentity: [String: Int] = [:]
        /// What held circuits keep, their reservations included.
        var held = 0
        var heldCircuits = 0
        var heldByIdentity: [String: Int] = [:]
        var refused: [Refusal: Int] = [:]
    }
    private let used = NIOLockedValueBox(Usage())

    public init(
        limit: Int,
        perIdentity: Int = CircuitRetention.defaultPerIdentity,
        heldPerIdentity: Int = CircuitRetention.defaultHeldPerIdentity
    ) {
        self.limit = limit
        self.perIdentity = perIdentity
        self.heldPerIdentity = heldPerIdentity
    }

    /// What every circuit keeps, attached and held.
    public var bytes: Int { used.withLockedValue { $0.total } }

    /// What held circuits keep, with their reservations (`writeReserve`): at most `limit`.
    public var heldBytes: Int { used.withLockedValue { $0.held } }

    /// How many circuits are held now.
    public var heldCircuits: Int { used.withLockedValue { $0.heldCircuits } }

    /// Circuits that were not held, by the bound that refused them, since the start.
    public func refused(_ bound: Refusal) -> Int { used.withLockedValue { $0.refused[bound] ?? 0 } }

    /// What the circuits whose far end is `identity` keep.
    public func bytes(of identity: String) -> Int { used.withLockedValue { $0.byIdentity[identity] ?? 0 } }

    /// How many identities keep something now (the registry's size).
    public var identities: Int { used.withLockedValue { $0.byIdentity.count } }

    /// Counts `bytes` (negative: given back) for a circuit whose far end is `identity`, and against the held total
    /// if the circuit is held (`held`); returns the totals after.
    @discardableResult
    func add(_ bytes: Int, identity: String?, held: Bool = false) -> (total: Int, identity: Int) {
        used.withLockedValue { used in
            used.total += bytes
            if held { used.held += bytes }
            guard let identity else { return (used.total, 0) }
            let kept = used.byIdentity[identity, default: 0] + bytes
            used.byIdentity[identity] = kept > 0 ? kept : nil
            return (used.total, kept)
        }
    }

    /// A circuit that keeps `bytes` lost its path: whether it may be held (then it counts against the held total
    /// and its identity's held circuits), or the bound that refuses it.
    func hold(_ bytes: Int, identity: String?) -> Refusal? {
        used.withLockedValue { used in
            if let identity, used.heldByIdentity[identity, default: 0] >= heldPerIdentity {
                used.refused[.identity, default: 0] += 1
                return .identity
            }
            guard used.held + bytes <= limit else {
                used.refused[.total, default: 0] += 1
                return .total
            }
            used.held += bytes
            used.heldCircuits += 1
            if let identity { used.heldByIdentity[identity, default: 0] += 1 }
            return nil
        }
    }

    /// A held circuit that keeps `bytes` and reserves `reserved` is no longer held (resumed, or closing).
    func release(_ bytes: Int, reserved: Int, identity: String?) {
        used.withLockedValue { used in
            used.held -= bytes + reserved
            used.heldCircuits -= 1
            guard let identity else { return }
            let held = used.heldByIdentity[identity, default: 0] - 1
            used.heldByIdentity[identity] = held > 0 ? held : nil
        }
    }

    /// Reserves `bytes` more for a held circuit under `limit`; false if they do not fit.
    func reserve(_ bytes: Int) -> Bool {
        used.withLockedValue { used in
            guard used.held + bytes <= limit else { return false }
            used.held += bytes
            return true
        }
    }
}

/// A circuit's plaintext side as a channel of its own, which outlives the path (the HTTP/2 stream) under it.
///
/// Everything that reads and writes a circuit (the end-to-end handler first, then the app's exchange, the tunnel's
/// glue or the gateway's proxy) lives in this channel's pipeline; the stream carries only its frames
/// (`CircuitPathHandler`). A circuit of a resumable suite keeps every record it sends until the peer acknowledges it
/// (ACK records, `CircuitAckDue`); when its path is lost it is held for the grace window (`CircuitPathMachine`), and
/// a new path (a resumption, `attach`) gets every record the peer had not received, sent again as it was sealed.
/// Nothing above sees the change but a pause. Why a channel of our own rather than the stream channel: the stream
/// channel, and everything in its pipeline, closes with its stream; the backend request of a held circuit must not.
///
/// Loop-bound: every method runs on `eventLoop`, as NIO's own channels' cores do.
public final class CircuitChannel: Channel, ChannelCore, @unchecked Sendable {
    public let eventLoop: any EventLoop
    public let allocator: ByteBufferAllocator
    public let parent: (any Channel)? = nil
    private var _pipeline: ChannelPipeline!
    public var pipeline: ChannelPipeline { _pipeline }
    public var _channelCore: any ChannelCore { self }
    private let closePromise: EventLoopPromise<Void>
    public var closeFuture: EventLoopFuture<Void> { closePromise.futureResult }
    public var localAddress: SocketAddress? { nil }
    public var remoteAddress: SocketAddress? { nil }

    /// Not writable until the handshake is done: what is written before waits, unbounded, in the end-to-end
    /// handler (`PendingWrites`), and a writer that goes by writability (an upload's body, the tunnel's glue) must
    /// not pour itself in there. A 16 MiB upload whose handshake was slow under load once went out whole at the
    /// handshake's end, past what the gateway takes unacknowledged (`e2e_window_exceeded`).
    private let flags = NIOLockedValueBox((active: true, writable: false, held: false))
    public var isActive: Bool { flags.withLockedValue { $0.active } }
    public var isWritable: Bool { flags.withLockedValue { $0.writable } }

    private var machine: CircuitPathMachine
    private let retention: CircuitRetention
    private var path: CircuitPathHandler?
    private var graceTimer: Scheduled<Void>?
    private var autoRead = true
    /// `ChannelOptions.allowRemoteHalfClosure`: true (the default here, unlike a socket's), the path's end of input
    /// goes up as `ChannelEvent.inputClosed` and the circuit's own direction goes on (a tunnel's client half-closes,
    /// then downloads); false, it closes the circuit as a socket channel closes at EOF. Closing our input
    /// (`close(mode: .input)`) is refused: a circuit cannot tell its peer to stop sending but by ending it.
    private var allowRemoteHalfClosure = true
    /// The pipeline asked for a read that no read-complete has answered yet.
    private var readAsked = false
    /// Whether the path should read now: always once the circuit is resumable (the end-to-end handler holds what
    /// the layer above has not asked for, and must see the peer's ACKs meanwhile: `InboundRecords`), else when asked.
    var readDemanded: Bool { readAsked || machine.resumable }

    /// Records counted from the handshake's end (`CircuitRecordsEvent.established`).
    private var counting = false
    /// Our records not yet acknowledged, oldest first; the first is record `firstRetained`.
    private var retained = CircularBuffer<ByteBuffer>()
    private var firstRetained: UInt64 = 0
    private var retainedBytes = 0
    /// Whether this circuit counts as held in the budget (`RetentionBudget.hold`), and what it has reserved there to
    /// read once more while held (`RetentionBudget.writeReserve`).
    private var heldInBudget = false
    private var reserved = 0
    /// How many records we had sent when our direction ended (its FINAL the last): an ACK of that many has it.
    private var sentAtOutputEnd: UInt64?
    /// Promises of kept records written while the circuit was not writable.
    private var waitingForWritability: [EventLoopPromise<Void>] = []
    /// How many of the peer's records were read, and how many of them the last ACK we sent covered.
    package private(set) var received: UInt64 = 0
    private var inputEndSent = false

    package private(set) var secrets: E2EResumeSecrets?
    /// The verified identity at the far end, once the handshake is done.
    public private(set) var peerID: String?
    /// Called when the circuit is held (its path lost): the device starts resuming here.
    package var onHeld: ((CircuitChannel) -> Void)?
    /// Called once when the circuit closes, whatever the reason (the gateway's held-circuit registry).
    package var onClosed: [(CircuitChannel) -> Void] = []
    /// Called when the handshake is done.
    package var onEstablished: [(CircuitChannel) -> Void] = []
    /// Called when the grace window ran out on a held circuit, before it closes.
    package var onGraceExpired: [(CircuitChannel) -> Void] = []

    /// Whether the circuit is held, readable from any thread (metrics, tests): the machine's state, mirrored by
    /// `machineChanged` after each transition that can change it, so the two never disagree while callbacks run.
    public var heldFlag: Bool { flags.withLockedValue { $0.held } }

    /// Mirrors the machine's "held" into `flags` (call after a transition: hold, resume, close, grace expiry).
    private func machineChanged() {
        let held = isHeld
        flags.withLockedValue { $0.held = held }
    }

    /// A circuit on `eventLoop` (its first path's), active at once; attach its first path before adding the
    /// end-to-end handler, which starts the handshake.
    public init(eventLoop: any EventLoop, allocator: ByteBufferAllocator, retention: CircuitRetention) {
        self.eventLoop = eventLoop
        self.allocator = allocator
        self.retention = retention
        self.machine = CircuitPathMachine(grace: retention.grace)
        self.closePromise = eventLoop.makePromise()
        self._pipeline = ChannelPipeline(channel: self)
    }

    /// Whether the circuit is held: no path, waiting for a resumption.
    package var isHeld: Bool {
        if case .held = machine.state { return true }
        return false
    }

    package var state: CircuitPathMachine.State { machine.state }

    /// What this circuit keeps of its own records, as counted against the bounds (tests).
    package var keptBytes: Int { retainedBytes }

    /// The records this circuit keeps, oldest first (tests).
    package var keptRecords: [ByteBuffer] { Array(retained) }

    /// The stream under the circuit now, if any (tests: what a foreign client does below its end-to-end layer).
    package var pathStream: (any Channel)? { path?.channel }

    // MARK: Channel

    public func setOption<Option: ChannelOption>(_ option: Option, value: Option.Value) -> EventLoopFuture<Void> {
        eventLoop.submit { try self.setOption0(option, value: value) }
    }

    public func getOption<Option: ChannelOption>(_ option: Option) -> EventLoopFuture<Option.Value> {
        eventLoop.submit { try self.getOption0(option) }
    }

    private func setOption0<Option: ChannelOption>(_ option: Option, value: Option.Value) throws {
        switch option {
        case _ as ChannelOptions.Types.AutoReadOption:
            autoRead = value as! Bool
            if autoRead { pipeline.syncOperations.read() }
        case _ as ChannelOptions.Types.AllowRemoteHalfClosureOption:
            allowRemoteHalfClosure = value as! Bool
        default:
            throw ChannelError.operationUnsupported
        }
    }

    private func getOption0<Option: ChannelOption>(_ option: Option) throws -> Option.Value {
        switch option {
        case _ as ChannelOptions.Types.AutoReadOption: return autoRead as! Option.Value
        case _ as ChannelOptions.Types.AllowRemoteHalfClosureOption: return allowRemoteHalfClosure as! Option.Value
        default: throw ChannelError.operationUnsupported
        }
    }

    public var syncOptions: (any NIOSynchronousChannelOptions)? { SyncOptions(channel: self) }

    private struct SyncOptions: NIOSynchronousChannelOptions {
        let channel: CircuitChannel

        func setOption<Option: ChannelOption>(_ option: Option, value: Option.Value) throws {
            channel.eventLoop.preconditionInEventLoop()
            try channel.setOption0(option, value: value)
        }

        func getOption<Option: ChannelOption>(_ option: Option) throws -> Option.Value {
            channel.eventLoop.preconditionInEventLoop()
            return try channel.getOption0(option)
        }
    }

    // MARK: ChannelCore

    public func localAddress0() throws -> SocketAddress { throw ChannelError.operationUnsupported }
    public func remoteAddress0() throws -> SocketAddress { throw ChannelError.operationUnsupported }
    public func register0(promise: EventLoopPromise<Void>?) { promise?.fail(ChannelError.operationUnsupported) }
    public func registerAlreadyConfigured0(promise: EventLoopPromise<Void>?) {
        promise?.fail(ChannelError.operationUnsupported)
    }
    public func bind0(to: SocketAddress, promise: EventLoopPromise<Void>?) {
        promise?.fail(ChannelError.operationUnsupported)
    }
    public func connect0(to: SocketAddress, promise: EventLoopPromise<Void>?) {
        promise?.fail(ChannelError.operationUnsupported)
    }
    public func channelRead0(_ data: NIOAny) {}
    public func errorCaught0(error: any Error) {}

    public func write0(_ data: NIOAny, promise: EventLoopPromise<Void>?) {
        guard isActive else {
            promise?.fail(ChannelError.ioOnClosedChannel)
            return
        }
        let frame = unwrapData(data, as: ByteBuffer.self)
        guard counting, machine.resumable else {
            guard let path, !machine.pathOutputEnded else {
                // After END_STREAM (without resumption it follows FINAL at once) nothing more goes on the stream:
                // an end-to-end handler's late ACK of a resumable suite that this end does not hold.
                promise?.fail(path == nil ? ChannelError.ioOnClosedChannel : ChannelError.outputClosed)
                return
            }
            path.write(frame, promise: promise)
            return
        }
        // A record of a resumable circuit is kept until acknowledged, so it is safe once kept, whatever becomes of
        // the path it goes on now (or the one it goes on later, if held). Its promise completes once the circuit is
        // writable, so a writer that waits on promises goes no faster than the peer acknowledges.
        let cost = frame.capacity + Self.recordOverhead
        retained.append(frame)
        retainedBytes += cost
        var kept: (total: Int, identity: Int)
        if heldInBudget {
            // Held: the read that brought it was started with a reservation, which covers it; what goes beyond (an
            // ACK or the FINAL, written whatever the writability) counts against the held total directly.
            let fromReserve = min(cost, reserved)
            reserved -= fromReserve
            // What the reservation covers is in the held total already: counted as kept only.
            kept = retention.budget.add(fromReserve, identity: peerID)
            if cost > fromReserve { kept = retention.budget.add(cost - fromReserve, identity: peerID, held: true) }
        } else {
            kept = retention.budget.add(cost, identity: peerID)
        }
        // After END_STREAM (the circuit settled) a late record (an ACK) is kept, not written: nothing may follow.
        if !machine.pathOutputEnded { path?.write(frame, promise: nil) }
        updateWritability(kept: kept)
        if let promise {
            if isWritable {
                promise.succeed()
            } else {
                waitingForWritability.append(promise)
            }
        }
    }

    public func flush0() { path?.flush() }

    public func read0() {
        guard isActive else { return }
        readAsked = true
        path?.demandRead()
    }

    public func close0(error: any Error, mode: CloseMode, promise: EventLoopPromise<Void>?) {
        guard isActive else {
            promise?.fail(ChannelError.alreadyClosed)
            return
        }
        switch mode {
        case .input:
            promise?.fail(ChannelError.operationUnsupported)
        case .output:
            if sentAtOutputEnd == nil { sentAtOutputEnd = firstRetained + UInt64(retained.count) }
            let action = machine.outputDidEnd()
            if !machine.resumable, action == .endPath, let path {
                path.close(mode: .output, promise: promise)
                return
            }
            // The FINAL record is kept like any other: the direction's end is safe now, and END_STREAM waits until
            // the circuit is settled (`CircuitPathMachine.pathEndDue`).
            promise?.succeed()
            perform(action)
        case .all:
            finish(promise: promise)
        }
    }

    public func triggerUserOutboundEvent0(_ event: Any, promise: EventLoopPromise<Void>?) {
        guard let event = event as? CircuitRecordsEvent else {
            if let path {
                path.triggerOutbound(event, promise: promise)
            } else {
                promise?.fail(ChannelError.ioOnClosedChannel)
            }
            return
        }
        switch event {
        case .established(let secrets, let peerID):
            counting = true
            self.secrets = secrets
            self.peerID = peerID
            if machine.established(resumable: secrets != nil && retention.grace > .zero) == .readAlways {
                path?.demandRead()
            }
            // Writable once the writes held for the handshake are in (the handler sends them right after this event):
            // at the first of them with a resumable suite (`write0`), else from the next turn.
            eventLoop.assumeIsolated().execute { if self.isActive { self.updateWritability() } }
            let callbacks = onEstablished
            onEstablished = []
            for callback in callbacks { callback(self) }
        case .acknowledged(let count):
            perform(acknowledge(count))
        case .peerFinished:
            perform(machine.peerDidFinish())
        }
        promise?.succeed()
    }

    // MARK: Records

    /// What a kept record costs in memory beyond its bytes (the buffer's storage object, the allocator's rounding,
    /// its slot in `retained`): counted against the bounds, so a stream of small records (SSE events) cannot keep
    /// several times the configured total. 1,000 held SSE circuits grew a gateway's RSS by 149 MiB against a 64 MiB
    /// total before it was counted (docs/benchmarks.md).
    package static let recordOverhead = 128

    /// The peer has opened `count` of our records: drop those from what is kept. Returns whether the path's end is
    /// due now (the ACK covers our FINAL of a circuit both ends ended).
    private func acknowledge(_ count: UInt64) -> CircuitPathMachine.PathEndAction {
        guard count > firstRetained else { return .none }
        let drop = Int(min(count - firstRetained, UInt64(retained.count)))
        var freed = 0
        for _ in 0..<drop {
            freed += retained.removeFirst().capacity + Self.recordOverhead
        }
        retainedBytes -= freed
        let kept = retention.budget.add(-freed, identity: peerID, held: heldInBudget)
        firstRetained += UInt64(drop)
        let action: CircuitPathMachine.PathEndAction
        if let sent = sentAtOutputEnd, count >= sent {
            action = machine.outputWasAcknowledged()
        } else {
            action = .none
        }
        updateWritability(kept: kept)
        return action
    }

    /// Carries out the machine's answer to an event that may settle the circuit.
    private func perform(_ action: CircuitPathMachine.PathEndAction) {
        guard action == .endPath, let path else { return }
        path.close(mode: .output, promise: nil)
    }

    /// Writable while the path is, and while what is kept is under the circuit's bound and, past
    /// `minimumPerCircuit`, under its identity's (`RetentionBudget.perIdentity`); a held circuit (no path) also only
    /// while it holds a whole read's reservation under the held total (`RetentionBudget.writeReserve`), so the read
    /// it may start fits. The total bounds only held circuits: an attached circuit's keeping is its records in
    /// flight, drained by the device's ACKs like an HTTP/2 window, and one device's held circuits filling the budget
    /// must not stall everyone else's answers. No circuit needs another's ACK to go on: one stopped by its identity
    /// keeps at least `minimumPerCircuit`, so its own peer owes it an ACK, and that ACK brings it here again.
    /// The circuit's bound is its high watermark: one that is not writable becomes so again only once what it keeps
    /// is down to `CircuitRetention.lowWatermark`, whatever stopped it.
    /// `kept`: the budget's totals as the caller just changed them, else they are read.
    private func updateWritability(kept: (total: Int, identity: Int)? = nil) {
        var writable = counting && (path?.isWritable ?? isHeld)
        // Whether what is kept is down to the low watermark: a circuit that is not writable becomes so only then.
        var belowLow = true
        if machine.resumable, writable {
            belowLow = retainedBytes <= retention.lowWatermark
            let budget = retention.budget
            if retainedBytes >= retention.perCircuit {
                writable = false
            } else if retainedBytes >= CircuitRetention.minimumPerCircuit {
                let identity = kept?.identity ?? peerID.map(budget.bytes(of:)) ?? 0
                if identity >= budget.perIdentity { writable = false }
            }
            if writable, heldInBudget {
                let wanted = RetentionBudget.writeReserve - reserved
                if wanted > 0, budget.reserve(wanted) { reserved += wanted }
                writable = reserved == RetentionBudget.writeReserve
            }
        }
        let changed = flags.withLockedValue { flags -> Bool in
            let next = writable && (flags.writable || belowLow)
            guard flags.active, flags.writable != next else { return false }
            flags.writable = next
            return true
        }
        // Changed, the flag is `writable` now: it never turns true above the low watermark.
        if changed, writable, !waitingForWritability.isEmpty {
            let waiting = waitingForWritability
            waitingForWritability = []
            for promise in waiting { promise.succeed() }
        }
        if changed { pipeline.syncOperations.fireChannelWritabilityChanged() }
    }

    // MARK: From the path

    func pathRead(_ path: CircuitPathHandler, _ frame: ByteBuffer) {
        guard path === self.path, isActive else { return }
        if counting { received += 1 }
        pipeline.syncOperations.fireChannelRead(NIOAny(frame))
    }

    func pathReadComplete(_ path: CircuitPathHandler) {
        guard path === self.path, isActive else { return }
        readAsked = false
        pipeline.syncOperations.fireChannelReadComplete()
        if autoRead, isActive { pipeline.syncOperations.read() }
    }

    func pathInputClosed(_ path: CircuitPathHandler) {
        guard path === self.path, isActive, !inputEndSent else { return }
        inputEndSent = true
        guard allowRemoteHalfClosure else {
            close0(error: ChannelError.eof, mode: .all, promise: nil)
            return
        }
        pipeline.syncOperations.fireUserInboundEventTriggered(ChannelEvent.inputClosed)
    }

    func pathError(_ path: CircuitPathHandler, _ error: any Error) {
        guard path === self.path, isActive else { return }
        if let reset = error as? NIOHTTP2Errors.StreamClosed, reset.errorCode == FabricProtocol.dialDeniedReset,
            !machine.isSettled
        {
            // The relay cut it: the service's dial policy no longer allows this identity. Not a lost path: the
            // relay would refuse a resumption with `dial_denied`, so the circuit ends with that now.
            machine.closed()
            machineChanged()
            pipeline.syncOperations.fireErrorCaught(
                E2ECircuitError.refused(
                    code: "dial_denied",
                    reason: "the service's dial policy no longer allows this identity: the controller ended the circuit"
                )
            )
            if isActive { finish(promise: nil) }
            return
        }
        // A reset stream of a circuit that may be resumed is a lost path, not an error: `pathInactive` follows.
        if machine.resumable, !machine.isSettled, CircuitEnd.isCut(error), machine.grace > .zero { return }
        pipeline.syncOperations.fireErrorCaught(error)
    }

    func pathWritabilityChanged(_ path: CircuitPathHandler) {
        guard path === self.path else { return }
        updateWritability()
    }

    func pathInactive(_ path: CircuitPathHandler) {
        guard path === self.path, isActive else { return }
        self.path = nil
        switch machine.pathLost(now: eventLoop.now) {
        case .none:
            break
        case .end:
            finish(promise: nil)
        case .hold(let deadline):
            // Held with a read's reservation already: the circuit's source may have a read under way, asked for
            // while it was attached, which arrives whatever its writability now (200 held circuits went 0.55 MB past
            // an 8 MiB total that way, each by its first read after the hold).
            if let refusal = retention.budget.hold(retainedBytes + RetentionBudget.writeReserve, identity: peerID) {
                // Not held at all: it ends with its path, as its grace window would end it (issue 49's hard bounds).
                machine.closed()
                machineChanged()
                pipeline.syncOperations.fireErrorCaught(E2ECircuitError.notResumed(because: Self.notHeld(refusal)))
                if isActive { finish(promise: nil) }
                return
            }
            heldInBudget = true
            reserved = RetentionBudget.writeReserve
            compactKept()
            machineChanged()
            graceTimer = eventLoop.assumeIsolated().scheduleTask(deadline: deadline) { self.graceRanOut() }
            updateWritability()
            onHeld?(self)
        }
    }

    /// Copies what a circuit just held keeps into one buffer, each record a slice of it, when its records' buffers
    /// cost a quarter more than their bytes (small records: an SSE stream's events, each in a buffer of its own with
    /// the allocator's rounding). Held circuits are the ones whose memory must go back to the system: their records
    /// were allocated while every circuit wrote, interleaved in the heap with those of circuits that end now, so the
    /// pages they sit on could not be returned when the others went (400 SSE circuits of a device that stopped
    /// acknowledging: 70 held under a 32 MiB total kept the gateway 116 MiB above its size with them attached, until
    /// their window ran out, docs/benchmarks.md). Once copied, the old buffers go, and what is held is counted at its
    /// bytes. The copy is paid once per hold, at most what the circuit keeps (`--resume-buffer`). The buffer lives
    /// until its last record is acknowledged, so a resumed circuit's memory drains at its last ACK of them, not at each.
    private func compactKept() {
        var bytes = 0
        for frame in retained { bytes += frame.readableBytes }
        guard retained.count > 1, retainedBytes > bytes + bytes / 4 + retained.count * Self.recordOverhead else {
            return
        }
        var storage = allocator.buffer(capacity: bytes)
        for frame in retained { storage.writeImmutableBuffer(frame) }
        // Sliced only once it is all written: a slice shares the buffer, and a write to a shared buffer copies it
        // whole (slicing as it went copied it once per record: 14 GB for 71 held circuits of SSE events).
        var compacted = CircularBuffer<ByteBuffer>(initialCapacity: retained.count)
        var start = 0
        for frame in retained {
            compacted.append(storage.getSlice(at: start, length: frame.readableBytes)!)
            start += frame.readableBytes
        }
        let cost = bytes + compacted.count * Self.recordOverhead
        let freed = retainedBytes - cost
        retained = compacted
        retainedBytes = cost
        retention.budget.add(-freed, identity: peerID, held: true)
    }

    /// Why a circuit that lost its path was not held.
    static func notHeld(_ refusal: RetentionBudget.Refusal) -> String {
        switch refusal {
        case .total: "this end's held circuits keep as much as they may (--resume-total): it was not held"
        case .identity: "this identity has as many circuits held at this end as it may: it was not held"
        }
    }

    /// Gives the budget back what this circuit counted as held (it is resumed, or closes).
    private func releaseHold() {
        guard heldInBudget else { return }
        retention.budget.release(retainedBytes, reserved: reserved, identity: peerID)
        heldInBudget = false
        reserved = 0
    }

    private func graceRanOut() {
        guard machine.graceExpired(now: eventLoop.now) else { return }
        machineChanged()
        for callback in onGraceExpired { callback(self) }
        pipeline.syncOperations.fireErrorCaught(E2ECircuitError.notResumed)
        if isActive { finish(promise: nil) }
    }

    // MARK: Paths

    /// Makes `path` the circuit's first path. The handshake runs over it.
    public func start(on path: CircuitPathHandler) {
        eventLoop.preconditionInEventLoop()
        precondition(self.path == nil && machine.state == .handshaking)
        self.path = path
        path.circuit = self
        pipeline.syncOperations.fireChannelRegistered()
        pipeline.syncOperations.fireChannelActive()
        if autoRead { pipeline.syncOperations.read() }
    }

    /// The gateway: a resume message (its tag checked against `secrets`) asks to move the circuit to `path`.
    /// Returns the refusal's reason, or nil once `path` is attached: its first frame is `answer`, then every record
    /// from `peerReceived` on.
    package func resume(on path: CircuitPathHandler, attempt: UInt32, peerReceived: UInt64, answer: ByteBuffer)
        -> String?
    {
        guard isActive else { return "the circuit is not held" }
        let now = eventLoop.now
        if case .refuse(let reason) = machine.resumeVerdict(attempt: attempt, now: now) { return reason }
        guard peerReceived >= firstRetained else {
            return "the resumption names fewer records than this end's peer acknowledged"
        }
        guard peerReceived <= firstRetained + UInt64(retained.count) else {
            return "the resumption names records this end never sent"
        }
        guard machine.resumeAccepted(attempt: attempt, now: now) else { return "the circuit is not held" }
        attach(path, peerReceived: peerReceived, first: answer)
        return nil
    }

    /// The device: the gateway answered `attempt` (its tag checked) on `path`, having received `peerReceived` of our
    /// records. Returns false if the circuit can no longer take it (closed, or the count is impossible).
    package func resumed(on path: CircuitPathHandler, peerReceived: UInt64) -> Bool {
        guard isActive, peerReceived >= firstRetained, peerReceived <= firstRetained + UInt64(retained.count),
            machine.resumed()
        else { return false }
        attach(path, peerReceived: peerReceived, first: nil)
        return true
    }

    /// The device's next resumption attempt, while held.
    package func nextAttempt() -> UInt32? { machine.nextAttempt(now: eventLoop.now) }

    /// When the grace window ends, for a held circuit.
    package var heldUntil: NIODeadline? {
        if case .held(let deadline) = machine.state { return deadline }
        return nil
    }

    /// Ends a held circuit now: its resumption failed for good (`reason` says why).
    package func failResumption(_ reason: String) {
        failResumption(with: E2ECircuitError.notResumed(because: reason))
    }

    /// Ends a held circuit now with `error` (`E2ECircuitError.refused`: the controller said the identity may no
    /// longer use it).
    package func failResumption(with error: E2ECircuitError) {
        guard isActive, isHeld else { return }
        machine.closed()
        machineChanged()
        pipeline.syncOperations.fireErrorCaught(error)
        if isActive { finish(promise: nil) }
    }

    private func attach(_ new: CircuitPathHandler, peerReceived: UInt64, first: ByteBuffer?) {
        // A circuit's state is its event loop's, and a path calls into it from its stream's: the two must be one loop.
        // Both ends make it so where they make their loop (one for a gateway's controller connections, `OverlayGateway`;
        // one for a dialer's, `OverlayDialer`), and the gateway refuses a resumption on another loop before it gets
        // here (`ResumableCircuits`). A violation would be a data race, so it stops the process.
        precondition(new.channel.map { $0.eventLoop === eventLoop } ?? true, "a circuit's new path is on another loop")
        releaseHold()
        machineChanged()
        graceTimer?.cancel()
        graceTimer = nil
        if let old = path {
            path = nil
            old.detach()
            old.close(mode: .all, promise: nil)
        }
        // The new path first: what is dropped now is judged against its writability, not a missing path's.
        path = new
        new.circuit = self
        // END_STREAM, if due, only after RESUMED and the records sent again (below): the ACK in the resumption may
        // be the one that settles the circuit, or it was settled before and this path has had none.
        let ended = acknowledge(peerReceived)
        if let first { new.write(first, promise: nil) }
        for frame in retained { new.write(frame, promise: nil) }
        new.flush()
        if readDemanded { new.demandRead() }
        updateWritability()
        perform(ended == .endPath ? .endPath : machine.pathEndAction())
    }

    /// How long a path ended cleanly at the circuit's close waits for the peer's END_STREAM before it is reset: 10 s
    /// of silence from the peer (its ACKs of the last records keep it going), 5 minutes at most
    /// (`CircuitPathHandler.linger`). Also how long a reset waits for the last write to leave.
    static let lingerTimeout: TimeAmount = .seconds(10)
    static let lingerLimit: TimeAmount = .minutes(5)

    private func finish(promise: EventLoopPromise<Void>?) {
        let action = path == nil ? .reset : machine.closing()
        machine.closed()
        machineChanged()
        graceTimer?.cancel()
        flags.withLockedValue { $0.active = false }
        releaseHold()
        retention.budget.add(-retainedBytes, identity: peerID)
        retained.removeAll()
        retainedBytes = 0
        let waiting = waitingForWritability
        waitingForWritability = []
        for promise in waiting { promise.fail(ChannelError.ioOnClosedChannel) }
        if let path {
            self.path = nil
            path.detach()
            switch action {
            case .reset:
                path.reset(within: Self.lingerTimeout)
            case .end(let sendEndStream):
                // Both directions ended: the path ends cleanly, so the peer gets what is still on its way (our
                // FINAL, our ACK of its own) and no reset it would take for a lost path.
                if sendEndStream { path.close(mode: .output, promise: nil) }
                path.linger(silence: Self.lingerTimeout, limit: Self.lingerLimit)
            }
        }
        promise?.succeed()
        pipeline.syncOperations.fireChannelInactive()
        pipeline.syncOperations.fireChannelUnregistered()
        let callbacks = onClosed
        onClosed = []
        onHeld = nil
        for callback in callbacks { callback(self) }
        eventLoop.assumeIsolated().execute {
            self.removeHandlers(pipeline: self.pipeline)
            self.closePromise.succeed()
        }
    }
}
