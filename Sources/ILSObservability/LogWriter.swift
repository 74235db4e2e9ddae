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

/// Writes finished log lines to a file descriptor (stderr in the binary), each line whole.
///
/// The access log writes a line per proxied request from an event-loop thread. Written one by one that is a
/// `write(2)` per request — a file write, or under systemd a write that wakes journald — about 5 % of the HTTP-mode
/// gateway's CPU under load. So a line written on an event loop with `deferrable` set is kept in that loop's buffer
/// and written, together with the others of the same turn, by a task the loop runs at the end of its current turn
/// (before it next waits for I/O): at most one turn late, one `write(2)` per turn. Everything else — warnings and
/// errors, and any line from a thread that is not an event loop — is written at once, after the buffered lines of the
/// same loop, so a thread's lines keep their order. A buffer is written early when it reaches 64 KiB, and
/// `flushAll()` (called at exit) writes what is left.
public final class LogWriter: Sendable {
    /// The process's standard error.
    public static let standardError = LogWriter(fileDescriptor: 2)

    /// A loop's buffer is written early at this size.
    static let bufferLimit = 64 * 1024

    private let fileDescriptor: Int32
    /// Lines waiting for the end of their loop's turn, by loop.
    private let pending = NIOLockedValueBox<[ObjectIdentifier: [UInt8]]>([:])
    /// Held for each `write(2)` sequence, so lines from two threads never interleave inside one another.
    private let writeLock = NIOLock()

    public init(fileDescriptor: Int32) {
        self.fileDescriptor = fileDescriptor
    }

    /// Writes `line` (which ends in a newline): at the end of the current event-loop turn when `deferrable` and
    /// called on an event loop, otherwise now.
    public func write(_ line: [UInt8], deferrable: Bool) {
        guard let loop = MultiThreadedEventLoopGroup.currentEventLoop else {
            writeNow(line)
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
            writeNow(due)
        } else if first {
            loop.execute { self.flush(key) }
        }
    }

    /// Writes every buffered line now.
    public func flushAll() {
        let buffers = pending.withLockedValue { buffers in
            defer { buffers.removeAll() }
            return Array(buffers.values)
        }
        for buffer in buffers { writeNow(buffer) }
    }

    private func flush(_ key: ObjectIdentifier) {
        guard let buffer = pending.withLockedValue({ $0.removeValue(forKey: key) }) else { return }
        writeNow(buffer)
    }

    private func writeNow(_ bytes: [UInt8]) {
        writeLock.withLock {
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
}
