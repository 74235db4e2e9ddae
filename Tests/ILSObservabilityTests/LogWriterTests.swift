import ILSObservability
import NIOCore
import NIOPosix
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// `LogWriter` against a real file: what is in the file, and when (in event-loop turns, not in time).
@Suite("Log lines written once per event-loop turn")
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
            return target.contents
        }.get()
        #expect(duringTurn == "")
        // A task submitted now runs after the flush the writer queued in that turn.
        try await loop.submit {}.get()
        #expect(target.contents == "one\ntwo\n")
        try await group.shutdownGracefully()
    }

    @Test("a warning is written at once, after the lines its loop was holding")
    func undeferrableKeepsOrder() async throws {
        let group = MultiThreadedEventLoopGroup(numberOfThreads: 1)
        let target = Target()
        let duringTurn = try await group.next().submit {
            target.writer.write(Self.line("access"), deferrable: true)
            target.writer.write(Self.line("warning"), deferrable: false)
            return target.contents
        }.get()
        #expect(duringTurn == "access\nwarning\n")
        try await group.shutdownGracefully()
    }

    @Test("off an event loop every line is written at once")
    func notOnALoop() {
        let target = Target()
        target.writer.write(Self.line("main"), deferrable: true)
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

    @Test("a loop's buffer is written early once it holds 64 KiB")
    func boundedBuffer() async throws {
        let group = MultiThreadedEventLoopGroup(numberOfThreads: 1)
        let target = Target()
        let line = Self.line(String(repeating: "x", count: 1023))
        let duringTurn = try await group.next().submit {
            for _ in 0..<80 { target.writer.write(line, deferrable: true) }
            return target.contents.utf8.count
        }.get()
        #expect(duringTurn >= 64 * 1024)
        #expect(duringTurn < 80 * 1024)
        try await group.next().submit {}.get()
        #expect(target.contents.utf8.count == 80 * 1024)
        try await group.shutdownGracefully()
    }
}
