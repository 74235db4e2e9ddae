import Foundation
import ILSClient
import ILSCore
import ILSTesting
import NIOConcurrencyHelpers

#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// Runs `body` with a fresh in-process cluster and always stops it; prints the cluster's log when `body` throws.
func withClientCluster(_ body: (TestCluster) async throws -> Void) async throws {
    let cluster = try await TestCluster.start()
    do {
        try await body(cluster)
    } catch {
        await cluster.stop()
        print("cluster \(cluster.id) logged:\n" + cluster.capturedLog.joined(separator: "\n"))
        throw error
    }
    await cluster.stop()
}

/// A URLSession whose requests to `host` go through `client` to `service`. Each test routes a host of its own, so
/// tests running at the same time never share a route.
struct OverlaySession {
    let host: String
    let session: URLSession
    let recorder: SessionRecorder

    init(client: OverlayClient, service: String = "claude-api") {
        host = "svc-\(UUID().uuidString.prefix(8).lowercased())"
        recorder = SessionRecorder()
        session = URLSession(
            configuration: client.sessionConfiguration(routes: [host: service]),
            delegate: recorder,
            delegateQueue: nil
        )
    }

    func url(_ pathAndQuery: String) -> URL {
        URL(string: "http://\(host)\(pathAndQuery)")!
    }

    func finish() {
        session.invalidateAndCancel()
        OverlayURLProtocol.routes.remove([host])
    }
}

/// What the session's delegate saw, in order, as an async sequence.
final class SessionRecorder: NSObject, URLSessionDataDelegate, @unchecked Sendable {
    // @unchecked: the continuation is thread-safe; nothing else is mutable.
    enum Event {
        case response(HTTPURLResponse)
        case data(Data)
        case completed((any Error)?)
    }

    let events: AsyncStream<Event>
    private let continuation: AsyncStream<Event>.Continuation

    override init() {
        (events, continuation) = AsyncStream.makeStream(of: Event.self)
    }

    func urlSession(
        _ session: URLSession,
        dataTask: URLSessionDataTask,
        didReceive response: URLResponse,
        completionHandler: @escaping (URLSession.ResponseDisposition) -> Void
    ) {
        if let response = response as? HTTPURLResponse { continuation.yield(.response(response)) }
        completionHandler(.allow)
    }

    func urlSession(_ session: URLSession, dataTask: URLSessionDataTask, didReceive data: Data) {
        continuation.yield(.data(data))
    }

    func urlSession(_ session: URLSession, task: URLSessionTask, didCompleteWithError error: (any Error)?) {
        continuation.yield(.completed(error))
    }
}

/// The whole answer of one task: status, body and error, read from the recorder to completion.
struct Collected {
    var status = 0
    var body = Data()
    var error: (any Error)?

    static func collect(_ recorder: SessionRecorder) async -> Collected {
        var collected = Collected()
        for await event in recorder.events {
            switch event {
            case .response(let response): collected.status = response.statusCode
            case .data(let data): collected.body.append(data)
            case .completed(let error):
                collected.error = error
                return collected
            }
        }
        return collected
    }
}

/// Creates an identity through the admin API and returns its one-time token.
func makeToken(_ cluster: TestCluster, name: String, role: IdentityRole = .device) async throws -> String {
    let created: ControllerAPI.TokenResponse = try await cluster.admin().call(
        .POST,
        "/v1/admin/identities",
        body: ControllerAPI.CreateIdentityRequest(name: name, role: role, attributes: [], tokenLifetimeSeconds: 600)
    )
    return created.token
}

/// SSE `data:` lines in `text`, in order.
func sseData(_ text: String) -> [String] {
    text.split(separator: "\n").filter { $0.hasPrefix("data: ") }.map { String($0.dropFirst(6)) }
}
