import Foundation

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// Output that reaches its reader at once: each line is written with one unbuffered write, so a line appears when
/// it arrives even when stdout is a pipe (stdio would hold it in a 4 KiB buffer).
enum ExampleOutput {
    static func line(_ text: String) {
        FileHandle.standardOutput.write(Data((text + "\n").utf8))
    }

    static func say(_ text: String) {
        line(text)
    }

    /// A remark that is not part of the answer, on stderr.
    static func note(_ sentence: String) {
        FileHandle.standardError.write(Data("ils-client-example: \(sentence)\n".utf8))
    }

    static func fail(_ sentence: String, status: Int32) -> Never {
        FileHandle.standardError.write(Data("ils-client-example: \(sentence)\n".utf8))
        exit(status)
    }
}
