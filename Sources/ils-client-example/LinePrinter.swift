import Foundation
import ILSClient

#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// Prints each line of a response as it arrives, with its arrival time; an HTTP error's body goes to stderr.
final class LinePrinter: NSObject, URLSessionDataDelegate, @unchecked Sendable {
    // @unchecked: every callback runs on `queue`, which runs one operation at a time.
    let queue: OperationQueue = {
        let queue = OperationQueue()
        queue.maxConcurrentOperationCount = 1
        return queue
    }()
    private var pending = Data()
    private var status = 0
    private var errorBody = Data()
    private var finished: CheckedContinuation<Result<Void, ExampleFailure>, Never>?
    /// Cancel the task once this many lines are printed (`--cancel-after`), and whether it was.
    private let cancelAfter: Int?
    private var printed = 0
    private var cancelled = false

    init(cancelAfter: Int? = nil) {
        self.cancelAfter = cancelAfter
    }

    private static let clock: DateFormatter = {
        let formatter = DateFormatter()
        formatter.locale = Locale(identifier: "en_US_POSIX")
        formatter.dateFormat = "HH:mm:ss.SSS"
        return formatter
    }()

    /// Runs `task` to its end.
    func run(_ task: URLSessionDataTask) async -> Result<Void, ExampleFailure> {
        await withCheckedContinuation { continuation in
            queue.addOperation {
                self.finished = continuation
                task.resume()
            }
        }
    }

    func urlSession(
        _ session: URLSession,
        dataTask: URLSessionDataTask,
        didReceive response: URLResponse,
        completionHandler: @escaping (URLSession.ResponseDisposition) -> Void
    ) {
        status = (response as? HTTPURLResponse)?.statusCode ?? 0
        completionHandler(.allow)
    }

    func urlSession(_ session: URLSession, dataTask: URLSessionDataTask, didReceive data: Data) {
        guard (200..<300).contains(status) else {
            // An error answer is short; what is kept of it is bounded all the same.
            if errorBody.count < 4096 { errorBody.append(data.prefix(4096 - errorBody.count)) }
            return
        }
        pending.append(data)
        while !cancelled, let newline = pending.firstIndex(of: UInt8(ascii: "\n")) {
            emit(pending[pending.startIndex..<newline])
            pending.removeSubrange(pending.startIndex...newline)
            if let cancelAfter, printed >= cancelAfter {
                cancelled = true
                dataTask.cancel()
            }
        }
    }

    func urlSession(_ session: URLSession, task: URLSessionTask, didCompleteWithError error: (any Error)?) {
        let result: Result<Void, ExampleFailure>
        if cancelled, let error = error as? URLError, error.code == .cancelled {
            ExampleOutput.note("cancelled after \(printed) lines")
            result = .success(())
        } else if let error = error as? URLError {
            result = .failure(ExampleFailure(error))
        } else if let error {
            result = .failure(ExampleFailure(sentence: "the request failed: \(error.localizedDescription)", status: 74))
        } else if !(200..<300).contains(status) {
            result = .failure(ExampleFailure(status: status, body: errorBody))
        } else {
            emit(pending)
            result = .success(())
        }
        finished?.resume(returning: result)
        finished = nil
    }

    private func emit(_ line: Data) {
        var text = String(decoding: line, as: UTF8.self)
        if text.hasSuffix("\r") { text.removeLast() }
        guard !text.isEmpty else { return }
        printed += 1
        ExampleOutput.line("\(Self.clock.string(from: Date())) \(text)")
    }
}
