import NIOConcurrencyHelpers
import NIOCore
import NIOPosix

#if canImport(Glibc)
import Glibc
/// `write(2)`, named apart from `LogWriter.write`.
private let systemWrite = Glibc.write
#elseif canImport(Musl)
import Musl
private let systemWrite = Musl.write
#elseif canImport(Darwin)
import Darwin
private let systemWrite = Darwin.write
#endif

/// Writes finished log lines to a file descriptor (stderr in the binary), each line whole, in order, and never from
/// the thread that logs: a stalled reader of the log must not stall the gateway.
///
/// Two stages. First, the access log writes a line per proxied request from an event-loop thread; handed on one by
/// one that is a hand-off per request, and written one by one a `write(2)` per request (about 5 % of the HTTP-mode
/// gateway's CPU under load once). So a line written on an event loop with `deferrable` set is kept in that loop's
/// buffer and handed on, together with the others of the same turn, by a task the loop runs at the end of its current
/// turn (before it next waits for I/O): at most one turn late. Everything else (warnings and errors, and any line from
/// a thread that is not an event loop) is handed on at once, after the buffered lines of the same loop, so a thread's
/// lines keep their order. A loop's buffer is handed on early when it reaches 64 KiB.
///
/// Second, what is handed on goes to a bounded queue that one thread of its own writes out. `write(2)` to a pipe
/// whose reader has stopped (journald under pressure, a terminal paused with Ctrl-S, a `| less` left open) blocks;
/// before, it blocked the event loop that logged, holding a process-wide lock, so every loop stopped with it. Now only
/// the writer thread waits. While it does, the queue fills to `queueLimit` (1 MiB by default, about 4,000 access
/// lines) and what does not fit is dropped and counted; once the reader takes lines again, the writer says how many
/// were dropped (`dropNotice`), after the lines written before them. `flushAll()` (called at exit) hands on what the
/// loops hold and waits, for at most `flushWait`, until the queue is written.
///
/// Why not swift-log's `StreamLogHandler`: it writes with `fwrite` under a lock from the logging thread, which is
/// the blocking this avoids; and no package on this machine's mirror offers an asynchronous, bounded log sink.
public final class LogWriter: Sendable {
    /// The process's standard error.
    public static let standardError = LogWriter(fileDescriptor: 2)

    /// A loop's buffer is handed on early at this size.
    static let bufferLimit = 64 * 1024
    /// What may wait for the writer thread by default, beyond what the file descriptor itself takes.
    public static let defaultQueueLimit = 1024 * 1024
    /// How long `flushAll` waits for the writer thread: at exit, a stalled reader must not keep the process alive.
    static let flushWait: Int64 = 2_000_000_000

    private let fileDescriptor: Int32
    private let queueLimit: Int
    /// Lines waiting for the end of their loop's turn, by loop.
    private let pending = NIOLockedValueBox<[ObjectIdentifier: [UInt8]]>([:])
    /// What waits for the writer thread; `true` while there is something to write.
    private let work = ConditionLock(value: false)
    private let queue: QueueBox
    private let writerStarted = NIOLockedValueBox(false)
    /// The line that says how many lines were dropped (the binary sets it to a log line in its format).
    private let notice = NIOLockedValueBox<@Sendable (Int) -> [UInt8]>(LogWriter.plainDropNotice)

    /// The queue's state, read and changed only while `work` is locked.
    private final class QueueBox: @unchecked Sendable {
        var bytes: [UInt8] = []
        /// Lines dropped since the writer last said so.
        var dropped = 0
        /// The writer has taken a batch and is writing it.
        var writing = false
        /// Bytes ever handed to the queue, dropped or not (tests watch it).
        var handed = 0
    }

    public init(fileDescriptor: Int32, queueLimit: Int = LogWriter.defaultQueueLimit) {
        self.fileDescriptor = fileDescriptor
        self.queueLimit = queueLimit
        self.queue = QueueBox()
    }

    static func plainDropNotice(_ count: Int) -> [UInt8] {
        Array("\(count) log lines dropped: the log's reader did not keep up\n".utf8)
    }

    /// Sets the line that reports `count` dropped lines (it must end in a newline).
    public func dropNotice(_ make: @escaping @Sendable (_ count: Int) -> [UInt8]) {
        notice.withLockedValue { $0 = make }
    }

    /// Bytes handed to the writer thread so far, dropped or not.
    package var handedBytes: Int {
        work.lock()
        defer { work.unlock() }
        return queue.handed
    }

    /// Lines dropped that the writer has not reported yet.
    package var droppedLines: Int {
        work.lock()
        defer { work.unlock() }
        return queue.dropped
    }

    /// Hands `line` (which ends in a newline) on: at the end of the current event-loop turn when `deferrable` and
    /// called on an event loop, otherwise now. Never blocks on the file descriptor.
    public func write(_ line: [UInt8], deferrable: Bool) {
        guard let loop = MultiThreadedEventLoopGroup.currentEventLoop else {
            enqueue(line)
            return
        }
        let key = ObjectIdentifier(loop)
        let (first, due): (Bool, [UInt8]?) = pending.withLockedValue { buffers in
            guard let index = buffers.index(forKey: key) else {
                guard deferrable, line.count < Self.bufferLimit else { return (true, line) }
                buffers[key] = line
                return (true, nil)
            }
            buffers.values[index].append(contentsOf: line)  // in place: one lookup, no copy
            guard !deferrable || buffers.values[index].count >= Self.bufferLimit else { return (false, nil) }
            return (false, buffers.remove(at: index).value)
        }
        if let due {
            enqueue(due)
        } else if first {
            loop.execute { self.flush(key) }
        }
    }

    /// Hands `line` on now, accepted whatever the queue holds: the one sentence a command ends with, which must not
    /// be the line a stalled reader made it drop. Not for lines that can come in numbers.
    public func writeFinal(_ line: [UInt8]) {
        flushAll()
        enqueue(line, always: true)
    }

    /// Hands on every buffered line, then waits until the writer thread has written all of it, or `flushWait`.
    public func flushAll() {
        let buffers = pending.withLockedValue { buffers in
            defer { buffers.removeAll() }
            return Array(buffers.values)
        }
        for buffer in buffers { enqueue(buffer) }
        drain(until: NIODeadline.now() + .nanoseconds(Self.flushWait))
    }

    /// Waits, however long it takes, until the writer thread has written everything handed on so far (tests: a file
    /// must not be read, or closed, while the writer may still write to it).
    package func waitUntilWritten() {
        drain(until: nil)
    }

    /// Waits until the queue is written and nothing dropped is left to report, or until `deadline`.
    private func drain(until deadline: NIODeadline?) {
        while deadline.map({ NIODeadline.now() < $0 }) ?? true {
            work.lock()
            let done = queue.bytes.isEmpty && !queue.writing && queue.dropped == 0
            work.unlock()
            if done { return }
            usleep(1000)
        }
    }

    private func flush(_ key: ObjectIdentifier) {
        guard let buffer = pending.withLockedValue({ $0.removeValue(forKey: key) }) else { return }
        enqueue(buffer)
    }

    /// Queues `bytes` for the writer thread, or counts their lines as dropped when the queue cannot take them; a
    /// batch is always taken by an empty queue (the limit is for what waits, not for one loop's turn).
    private func enqueue(_ bytes: [UInt8], always: Bool = false) {
        startWriterIfNeeded()
        work.lock()
        queue.handed += bytes.count
        if !always, !queue.bytes.isEmpty, queue.bytes.count + bytes.count > queueLimit {
            queue.dropped += bytes.reduce(0) { $0 + ($1 == UInt8(ascii: "\n") ? 1 : 0) }
        } else {
            queue.bytes.append(contentsOf: bytes)
        }
        work.unlock(withValue: true)
    }

    private func startWriterIfNeeded() {
        let start = writerStarted.withLockedValue { started in
            defer { started = true }
            return !started
        }
        guard start else { return }
        // One thread of its own for the life of the process: the only one that ever waits on the file descriptor.
        let pool = NIOThreadPool(numberOfThreads: 1)
        pool.start()
        pool.submit { _ in self.writeForever() }
    }

    private func writeForever() {
        while true {
            work.lock(whenValue: true)
            let batch = queue.bytes
            let dropped = queue.dropped
            queue.bytes = []
            queue.dropped = 0
            queue.writing = true
            work.unlock(withValue: false)
            writeAll(batch)
            if dropped > 0 { writeAll(notice.withLockedValue { $0 }(dropped)) }
            work.lock()
            queue.writing = false
            work.unlock()
        }
    }

    private func writeAll(_ bytes: [UInt8]) {
        bytes.withUnsafeBytes { bytes in
            var offset = 0
            while offset < bytes.count {
                let written = systemWrite(fileDescriptor, bytes.baseAddress! + offset, bytes.count - offset)
                if written < 0, errno == EINTR { continue }
                if written <= 0 { break }
                offset += written
            }
        }
    }
}
