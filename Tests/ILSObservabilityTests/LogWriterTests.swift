import Foundation
import ILSObservability
import NIOCore
import NIOPosix
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// `LogWriter` against a real file: what is in the file, and when (in event-loop turns, not in time).
@Suite("Log lines handed on once per event-loop turn, written by a thread of their own")
struct LogWriterTests {
    /// A writer on a fresh temporary file, and a way to read the file back.
    final class Target: Sendable {
        let path: String
        let descriptor: Int32
        let writer: LogWriter

        init() {
            var template = Array("/tmp/ils-logwriter-XXXXXX".utf8CString)
            descriptor = template.withUnsafeMutableBufferPointer { mkstemp($0.baseAddress!) }
            path = String(decoding: template.dropLast().map { UInt8(bitPattern: $0) }, as: UTF8.self)
            writer = LogWriter(fileDescriptor: descriptor)
        }

        /// The file as it is now, read with `pread` (Foundation's file reading leaks a buffer on an empty file
        /// under ASan).
        var contents: String {
            writer.waitUntilWritten()
            var bytes: [UInt8] = []
            var chunk = [UInt8](repeating: 0, count: 16 * 1024)
            while true {
                let count = chunk.withUnsafeMutableBytes {
                    pread(descriptor, $0.baseAddress, $0.count, off_t(bytes.count))
                }
                if count <= 0 { break }
                bytes.append(contentsOf: chunk[0..<count])
            }
            return String(decoding: bytes, as: UTF8.self)
        }

        deinit {
            // Not while the writer may still write: the descriptor's number would go to the next file opened.
            writer.waitUntilWritten()
            close(descriptor)
            unlink(path)
        }
    }

    static func line(_ text: String) -> [UInt8] { Array((text + "\n").utf8) }

    @Test("deferrable lines on an event loop wait for the end of the loop's turn, then come whole and in order")
    func deferredToEndOfTurn() async throws {
        let group = MultiThreadedEventLoopGroup(numberOfThreads: 1)
        let target = Target()
        let loop = group.next()
        let duringTurn = try await loop.submit {
            target.writer.write(Self.line("one"), deferrable: true)
            target.writer.write(Self.line("two"), deferrable: true)
            return target.writer.handedBytes
        }.get()
        #expect(duringTurn == 0)
        // A task submitted now runs after the hand-off the writer queued in that turn.
        try await loop.submit {}.get()
        #expect(target.writer.handedBytes == 8)
        target.writer.flushAll()
        #expect(target.contents == "one\ntwo\n")
        try await group.shutdownGracefully()
    }

    @Test("a warning is handed on at once, after the lines its loop was holding")
    func undeferrableKeepsOrder() async throws {
        let group = MultiThreadedEventLoopGroup(numberOfThreads: 1)
        let target = Target()
        let duringTurn = try await group.next().submit {
            target.writer.write(Self.line("access"), deferrable: true)
            target.writer.write(Self.line("warning"), deferrable: false)
            return target.writer.handedBytes
        }.get()
        #expect(duringTurn == 15)
        target.writer.flushAll()
        #expect(target.contents == "access\nwarning\n")
        try await group.shutdownGracefully()
    }

    @Test("off an event loop every line is handed on at once")
    func notOnALoop() {
        let target = Target()
        target.writer.write(Self.line("main"), deferrable: true)
        #expect(target.writer.handedBytes == 5)
        target.writer.flushAll()
        #expect(target.contents == "main\n")
    }

    @Test("flushAll writes what the loops are holding (the binary calls it at exit)")
    func flushAllAtExit() async throws {
        let group = MultiThreadedEventLoopGroup(numberOfThreads: 1)
        let target = Target()
        let afterFlush = try await group.next().submit {
            target.writer.write(Self.line("last"), deferrable: true)
            target.writer.flushAll()
            return target.contents
        }.get()
        #expect(afterFlush == "last\n")
        try await group.shutdownGracefully()
    }

    @Test("a loop's buffer is handed on early once it holds 64 KiB")
    func boundedBuffer() async throws {
        let group = MultiThreadedEventLoopGroup(numberOfThreads: 1)
        let target = Target()
        let line = Self.line(String(repeating: "x", count: 1023))
        let duringTurn = try await group.next().submit {
            for _ in 0..<80 { target.writer.write(line, deferrable: true) }
            return target.writer.handedBytes
        }.get()
        #expect(duringTurn >= 64 * 1024)
        #expect(duringTurn < 80 * 1024)
        try await group.next().submit {}.get()
        #expect(target.writer.handedBytes == 80 * 1024)
        target.writer.flushAll()
        #expect(target.contents.utf8.count == 80 * 1024)
        try await group.shutdownGracefully()
    }

    @Test(
        "with the reader stopped, writing never blocks: what does not fit is dropped and counted, and once the reader reads again every line is there whole, in order, or in a count"
    )
    func stalledReader() throws {
        var ends: [Int32] = [0, 0]
        #expect(pipe(&ends) == 0)
        let (readEnd, writeEnd) = (ends[0], ends[1])
        defer {
            close(readEnd)
            close(writeEnd)
        }
        // A pipe takes 64 KiB; the queue 32 KiB more. 2,000 lines of 100 bytes are 200 KB: some must be dropped.
        let writer = LogWriter(fileDescriptor: writeEnd, queueLimit: 32 * 1024)
        writer.dropNotice { Array("dropped \($0)\n".utf8) }
        let count = 2000
        // Off an event loop, each line is handed on at once; a write that blocked would hang here, not return.
        for index in 0..<count {
            writer.write(
                Self.line(String(format: "line %04d ", index) + String(repeating: "x", count: 89)),
                deferrable: true
            )
        }
        #expect(writer.handedBytes == count * 100)
        #expect(writer.droppedLines > 0)
        // The reader comes back. Read until every line is accounted for, written or counted as dropped (a burst can
        // also overrun the queue before the pipe is full, so there may be several counts).
        var text = ""
        var chunk = [UInt8](repeating: 0, count: 16 * 1024)
        var written: [Substring] = []
        var dropped = 0
        while written.count + dropped < count {
            let read = chunk.withUnsafeMutableBytes { Glibc.read(readEnd, $0.baseAddress, $0.count) }
            #expect(read > 0)
            if read <= 0 { break }
            text += String(decoding: chunk[0..<read], as: UTF8.self)
            guard let end = text.lastIndex(of: "\n") else { continue }
            for line in text[..<end].split(separator: "\n") {
                if line.hasPrefix("dropped "), let count = Int(line.dropFirst(8)) {
                    dropped += count
                } else {
                    written.append(line)
                }
            }
            text = String(text[text.index(after: end)...])
        }
        // Whole lines, in order; the rest counted; and at least one count, since the reader was away.
        let indices = written.compactMap { Int($0.dropFirst(5).prefix(4)) }
        #expect(indices.count == written.count)
        #expect(zip(indices, indices.dropFirst()).allSatisfy { $0 < $1 })
        #expect(written.allSatisfy { $0.hasPrefix("line ") && $0.utf8.count == 99 })
        #expect(written.count + dropped == count)
        #expect(dropped > 0)
        #expect(written.count < count)
        #expect(text.isEmpty)
        writer.flushAll()
        #expect(writer.droppedLines == 0)
    }
}
