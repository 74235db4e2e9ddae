public import Foundation
import NIOCore
import NIOHTTP1

#if canImport(FoundationNetworking)
public import FoundationNetworking
#endif

/// A response from `OverlayClient.stream`: its head now, its body as it arrives.
public struct OverlayResponse: Sendable {
    /// Status and headers, as URLSession would give them.
    public let response: HTTPURLResponse
    /// The body, one chunk per read from the circuit; never buffered to the end.
    public let body: Body

    /// Closes the circuit when the last copy of the response and its iterators is gone, so a body that is dropped
    /// unread does not keep a circuit (and a backend request) open.
    final class Handle: Sendable {
        let exchange: OverlayExchange
        init(_ exchange: OverlayExchange) { self.exchange = exchange }
        deinit { exchange.close() }
    }

    /// The body's chunks. Iteration throws a `URLError` (`ilsReason` `truncated` when the circuit ended before the
    /// response did); cancelling the iterating task closes the circuit.
    public struct Body: AsyncSequence, Sendable {
        public typealias Element = Data
        let handle: Handle
        let url: URL?

        public func makeAsyncIterator() -> Iterator { Iterator(handle: handle, url: url) }

        public struct Iterator: AsyncIteratorProtocol {
            let handle: Handle
            let url: URL?
            private var done = false

            init(handle: Handle, url: URL?) {
                self.handle = handle
                self.url = url
            }

            public mutating func next() async throws -> Data? {
                while !done {
                    let part: HTTPClientResponsePart?
                    do {
                        part = try await handle.exchange.next()
                    } catch {
                        done = true
                        handle.exchange.close()
                        throw OverlayURLError.make(error, url: url)
                    }
                    switch part {
                    case .body(let buffer): return Data(buffer.readableBytesView)
                    case .head: continue
                    case .end, nil:
                        done = true
                        handle.exchange.close()
                    }
                }
                return nil
            }
        }
    }
}
