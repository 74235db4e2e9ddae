import Foundation
import ILSClient
import ILSCore
import ILSTesting
import Testing

#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

@Suite("OverlayClient.stream: the async API for code without URLSession", .clusterExclusive)
struct AsyncStreamTests {
    @Test("the async API streams SSE event by event: the first before the backend emits the last")
    func streams() async throws {
        try await withClientCluster { cluster in
            let client = try OverlayClient(identity: try await cluster.enroll("tab", role: .device))
            let response = try await client.stream(URLRequest(url: URL(string: "http://claude-api/sse-held?n=3")!))
            #expect(response.response.statusCode == 200)
            #expect(response.response.value(forHTTPHeaderField: "Content-Type") == "text/event-stream")
            var received = ""
            var beforeRelease: [String]?
            for try await chunk in response.body {
                received += String(decoding: chunk, as: UTF8.self)
                if beforeRelease == nil, sseData(received).count == 2 {
                    beforeRelease = sseData(received)
                    #expect(cluster.backend.record.eventsSent == 2)
                    cluster.backend.held.release()
                }
            }
            #expect(beforeRelease == [#"{"index": 0}"#, #"{"index": 1}"#])
            #expect(sseData(received).count == 3)
        }
    }

    @Test("cancelling the task that reads the body closes the circuit, and the backend stops")
    func cancelling() async throws {
        try await withClientCluster { cluster in
            let client = try OverlayClient(identity: try await cluster.enroll("tab", role: .device))
            let (firstChunk, firstChunkArrived) = AsyncStream.makeStream(of: Void.self)
            let ended = Flag()
            let reader = Task {
                defer { ended.set() }
                let response = try await client.stream(
                    URLRequest(url: URL(string: "http://claude-api/sse?n=100000&interval_ms=20")!)
                )
                for try await _ in response.body { firstChunkArrived.yield() }
            }
            for await _ in firstChunk { break }
            reader.cancel()
            // Bounded: a cancel that does not reach the circuit leaves the reader streaming for ever.
            #expect(
                await TestCluster.eventually { ended.isSet },
                "the cancelled reader did not end"
            )
            if ended.isSet { await #expect(throws: URLError.self) { try await reader.value } }
            #expect(
                await TestCluster.eventually {
                    cluster.backend.record.streamsDisconnected == 1
                }
            )
        }
    }

    @Test("a POST body and the answer go through the async API")
    func post() async throws {
        try await withClientCluster { cluster in
            let client = try OverlayClient(identity: try await cluster.enroll("tab", role: .device))
            var request = URLRequest(url: URL(string: "http://claude-api/upload")!)
            request.httpMethod = "POST"
            request.httpBody = Data("hello".utf8)
            let response = try await client.stream(request)
            var body = Data()
            for try await chunk in response.body { body.append(chunk) }
            #expect(String(decoding: body, as: UTF8.self).hasPrefix("{\"bytes\":5,"))
        }
    }

    @Test("refusals are URLErrors with the overlay's reason")
    func refusal() async throws {
        try await withClientCluster { cluster in
            let client = try OverlayClient(identity: try await cluster.enroll("tab", role: .device))
            do throws(URLError) {
                _ = try await client.stream(URLRequest(url: URL(string: "http://nothing-here/health")!))
                Issue.record("a request to an unknown service succeeded")
            } catch {
                #expect(error.ilsReason == "unknown_service")
            }
        }
    }
}

/// A flag one task sets and another polls.
final class Flag: @unchecked Sendable {
    // @unchecked: `value` is only touched under `lock`.
    private let lock = NSLock()
    private var value = false

    var isSet: Bool { lock.withLock { value } }

    func set() { lock.withLock { value = true } }
}
