import Crypto
import Foundation
import ILSClient
import ILSCore
import ILSTesting
import Testing

#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

@Suite(
    "URLSession through the overlay (OverlayURLProtocol): controller, gateway and backend in process",
    .clusterExclusive
)
struct URLSessionTests {
    @Test("SSE events reach the delegate one by one: the first before the backend emits the last")
    func sseEventByEvent() async throws {
        try await withClientCluster { cluster in
            let overlay = OverlaySession(
                client: try OverlayClient(identity: try await cluster.enroll("tab", role: .device))
            )
            defer { overlay.finish() }
            overlay.session.dataTask(with: overlay.url("/sse-held?n=3")).resume()
            var received = ""
            var releasedAfter: [String]?
            var completion: (any Error)??
            for await event in overlay.recorder.events {
                switch event {
                case .response(let response): #expect(response.statusCode == 200)
                case .data(let data):
                    received += String(decoding: data, as: UTF8.self)
                    // The backend holds its last event until now: what arrived so far cannot have been buffered to
                    // the end of the response.
                    if releasedAfter == nil, sseData(received).count == 2 {
                        releasedAfter = sseData(received)
                        #expect(cluster.backend.record.eventsSent == 2)
                        cluster.backend.held.release()
                    }
                case .completed(let error): completion = .some(error)
                }
                if completion != nil { break }
            }
            #expect(releasedAfter == [#"{"index": 0}"#, #"{"index": 1}"#])
            #expect(sseData(received) == [#"{"index": 0}"#, #"{"index": 1}"#, #"{"index": 2}"#])
            #expect(completion! == nil)
        }
    }

    @Test("a 16 MiB upload passes intact, from httpBody and from httpBodyStream", .clusterAlone)
    func upload() async throws {
        try await withClientCluster { cluster in
            let client = try OverlayClient(identity: try await cluster.enroll("tab", role: .device))
            let payload = Data((0..<(16 * 1024 * 1024)).map { UInt8(truncatingIfNeeded: $0 &* 7 &+ 3) })
            let expected = SHA256.hash(data: payload).map { String(format: "%02x", $0) }.joined()
            for useStream in [false, true] {
                let overlay = OverlaySession(client: client)
                defer { overlay.finish() }
                var request = URLRequest(url: overlay.url("/upload"))
                request.httpMethod = "POST"
                if useStream {
                    request.httpBodyStream = InputStream(data: payload)
                } else {
                    request.httpBody = payload
                }
                overlay.session.dataTask(with: request).resume()
                let collected = await Collected.collect(overlay.recorder)
                #expect(collected.error == nil)
                #expect(collected.status == 200)
                let answer = String(decoding: collected.body, as: UTF8.self)
                #expect(answer == "{\"bytes\":\(payload.count),\"sha256\":\"\(expected)\"}", "stream: \(useStream)")
                if collected.error != nil {
                    // What the controller and the gateway said, to tell a lost path from a gateway's decision.
                    print("cluster \(cluster.id) logged:\n" + cluster.capturedLog.joined(separator: "\n"))
                }
            }
        }
    }

    #if canImport(FoundationNetworking)
    @Test("an upload task whose body this URLSession keeps from protocols fails loudly instead of sending no body")
    func uploadTaskBodyOutOfReach() async throws {
        try await withClientCluster { cluster in
            let overlay = OverlaySession(
                client: try OverlayClient(identity: try await cluster.enroll("tab", role: .device))
            )
            defer { overlay.finish() }
            var request = URLRequest(url: overlay.url("/upload"))
            request.httpMethod = "POST"
            overlay.session.uploadTask(with: request, from: Data("hello".utf8)).resume()
            let collected = await Collected.collect(overlay.recorder)
            #expect((collected.error as? URLError)?.ilsReason == "body_unavailable")
            #expect(collected.body.isEmpty)
        }
    }
    #endif

    @Test("a 16 MiB download arrives intact, in many chunks", .clusterAlone)
    func download() async throws {
        try await withClientCluster { cluster in
            let overlay = OverlaySession(
                client: try OverlayClient(identity: try await cluster.enroll("tab", role: .device))
            )
            defer { overlay.finish() }
            let size = 16 * 1024 * 1024
            overlay.session.dataTask(with: overlay.url("/bytes?size=\(size)")).resume()
            var body = Data()
            var chunks = 0
            var failure: (any Error)?
            loop: for await event in overlay.recorder.events {
                switch event {
                case .response(let response): #expect(response.statusCode == 200)
                case .data(let data):
                    body.append(data)
                    chunks += 1
                case .completed(let error):
                    failure = error
                    break loop
                }
            }
            #expect(failure == nil)
            #expect(body.count == size)
            #expect(SHA256.hash(data: body) == SHA256.hash(data: TestBackend.pattern(size: size)))
            #expect(chunks > 16)
        }
    }

    @Test("cancelling a task closes the circuit and the backend sees its client go away")
    func cancelStopsBackend() async throws {
        try await withClientCluster { cluster in
            let overlay = OverlaySession(
                client: try OverlayClient(identity: try await cluster.enroll("tab", role: .device))
            )
            defer { overlay.finish() }
            let task = overlay.session.dataTask(with: overlay.url("/sse?n=100000&interval_ms=20"))
            task.resume()
            var completion: (any Error)?
            loop: for await event in overlay.recorder.events {
                switch event {
                case .response: break
                case .data: if task.state == .running { task.cancel() }
                case .completed(let error):
                    completion = error
                    break loop
                }
            }
            #expect((completion as? URLError)?.code == .cancelled)
            #expect(
                await TestCluster.eventually {
                    cluster.backend.record.streamsDisconnected == 1
                }
            )
            let sent = cluster.backend.record.eventsSent
            // A later request through the same session and overlay, answered: the bound on the generation not going on.
            overlay.session.dataTask(with: overlay.url("/health")).resume()
            #expect(await Collected.collect(overlay.recorder).status == 200)
            #expect(cluster.backend.record.eventsSent == sent, "the backend kept generating after the cancel")
        }
    }

    @Test("a revoked identity gets a URLError whose ilsReason is identity_blocked")
    func revoked() async throws {
        try await withClientCluster { cluster in
            let identity = try await cluster.enroll("phone", role: .device)
            let _: IdentityRecord = try await cluster.admin().call(.POST, "/v1/admin/identities/phone/revoke")
            let overlay = OverlaySession(client: try OverlayClient(identity: identity))
            defer { overlay.finish() }
            overlay.session.dataTask(with: overlay.url("/health")).resume()
            let collected = await Collected.collect(overlay.recorder)
            let error = try #require(collected.error as? URLError)
            #expect(error.ilsReason == "identity_blocked")
            #expect(error.code == .userAuthenticationRequired)
            #expect(error.localizedDescription.contains("revoked"))
        }
    }

    @Test("a service that does not exist gets a URLError whose ilsReason is unknown_service")
    func unknownService() async throws {
        try await withClientCluster { cluster in
            let client = try OverlayClient(identity: try await cluster.enroll("tab", role: .device))
            let overlay = OverlaySession(client: client, service: "no-such-service")
            defer { overlay.finish() }
            overlay.session.dataTask(with: overlay.url("/health")).resume()
            let collected = await Collected.collect(overlay.recorder)
            let error = try #require(collected.error as? URLError)
            #expect(error.ilsReason == "unknown_service")
            #expect(error.code == .cannotFindHost)
        }
    }

    @Test("a response cut short by the backend is an error (truncated), never a complete answer")
    func truncated() async throws {
        try await withClientCluster { cluster in
            let overlay = OverlaySession(
                client: try OverlayClient(identity: try await cluster.enroll("tab", role: .device))
            )
            defer { overlay.finish() }
            overlay.session.dataTask(with: overlay.url("/die-mid-stream")).resume()
            let collected = await Collected.collect(overlay.recorder)
            let error = try #require(collected.error as? URLError)
            #expect(error.ilsReason == "truncated")
            #expect(error.code == .networkConnectionLost)
            #expect(String(decoding: collected.body, as: UTF8.self).contains("data: first"))
        }
    }

    @Test("hosts that are not routed are left to URLSession's own protocols")
    func unroutedHostsPassThrough() async throws {
        try await withClientCluster { cluster in
            let routed = URL(string: "http://svc-routing-check/x")!
            #expect(!OverlayURLProtocol.canInit(with: URLRequest(url: routed)))
            let client = try OverlayClient(identity: try await cluster.enroll("tab", role: .device))
            _ = client.sessionConfiguration(routes: ["svc-routing-check": "claude-api"])
            defer { OverlayURLProtocol.routes.remove(["svc-routing-check"]) }
            #expect(OverlayURLProtocol.canInit(with: URLRequest(url: routed)))
            #expect(OverlayURLProtocol.canInit(with: URLRequest(url: URL(string: "https://SVC-ROUTING-CHECK:8443/x")!)))
            #expect(!OverlayURLProtocol.canInit(with: URLRequest(url: URL(string: "http://example.com/x")!)))
            #expect(!OverlayURLProtocol.canInit(with: URLRequest(url: URL(string: "ftp://svc-routing-check/x")!)))
        }
    }
}
