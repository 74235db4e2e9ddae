public import Foundation
import NIOConcurrencyHelpers
import NIOCore
import NIOHTTP1

#if canImport(FoundationNetworking)
public import FoundationNetworking
#endif

/// Carries URLSession requests through the overlay, so an app's existing URLSession code reaches a service
/// unchanged: give its session the configuration `OverlayClient.sessionConfiguration` makes.
///
/// A request is taken when its URL's host is routed (`OverlayURLProtocol.routes`); any other request is left to
/// URLSession's own protocols. Bodies are sent as they are read (`httpBody` or `httpBodyStream`, which upload tasks
/// use), no faster than the circuit takes them; the response is parsed with NIOHTTP1 and handed to URLSession part
/// by part as it arrives (`urlProtocol(_:didLoad:)` per chunk), so Server-Sent Events reach the app one by one.
/// `stopLoading` (a cancelled task) closes the circuit. Failures are `URLError`s with the overlay's reason in
/// `ilsReason`.
public final class OverlayURLProtocol: URLProtocol {
    /// The task that loads the request, for `stopLoading` to cancel, and whether URLSession still listens.
    private struct Loading {
        var task: Task<Void, Never>?
        var stopped = false
    }
    private let loading = NIOLockedValueBox(Loading())

    /// Which hosts go to which service, through which client; shared by every session in the process.
    public static let routes = OverlayRoutes()

    override public class func canInit(with request: URLRequest) -> Bool {
        routes.route(for: request.url) != nil
    }

    override public class func canonicalRequest(for request: URLRequest) -> URLRequest {
        request
    }

    override public func startLoading() {
        let request = self.request
        guard let route = Self.routes.route(for: request.url) else {
            client?.urlProtocol(self, didFailWithError: URLError(.unsupportedURL))
            return
        }
        // swift-corelibs-foundation keeps an upload task's body (`uploadTask(with:from:)`) inside the task, out of a
        // protocol's reach: sending the request without it would lose the body without a word.
        if task is URLSessionUploadTask, request.httpBody == nil, request.httpBodyStream == nil {
            let reason =
                "this URLSession does not hand an upload task's body to protocols; "
                + "set httpBody or httpBodyStream on the request and use a data task"
            client?.urlProtocol(
                self,
                didFailWithError: OverlayURLError.make(code: "body_unavailable", reason: reason, url: request.url)
            )
            return
        }
        let instance = Instance(self)
        let task = Task { await instance.protocolInstance.load(request, route: route) }
        loading.withLockedValue { $0.task = task }
    }

    override public func stopLoading() {
        loading.withLockedValue { loading in
            loading.stopped = true
            loading.task?.cancel()
        }
    }

    /// Tells URLSession something, unless it has stopped listening. After `stopLoading` URLSession reports the
    /// cancellation itself and then forgets the task; a call after that reaches a task it no longer knows
    /// (swift-corelibs-foundation traps: "a task that in not in the registry"), so none is made once stopped.
    /// The lock is not held during the call: `stopLoading` runs on the task's work queue, which a client call may
    /// need (holding it deadlocked a cancel), and URLSession forgets the task only after it has delivered the
    /// cancellation on the delegate queue, well after the check.
    private func report(_ message: (any URLProtocolClient) -> Void) {
        guard let client = loading.withLockedValue({ $0.stopped ? nil : self.client }) else { return }
        message(client)
    }

    /// Hands the protocol to the task that loads its request. URLProtocol is not Sendable; URLSession calls
    /// `startLoading` and `stopLoading` once each, and every call to `client` from the task goes through `report`.
    private struct Instance: @unchecked Sendable {
        let protocolInstance: OverlayURLProtocol
        init(_ protocolInstance: OverlayURLProtocol) { self.protocolInstance = protocolInstance }
    }

    private func load(_ request: URLRequest, route: OverlayRoutes.Route) async {
        let url = request.url
        do {
            let (head, service) = try OverlayClient.head(for: request, service: route.service)
            let body = OverlayRequestBody(request)
            let exchange = try await OverlayExchange.open(
                dialer: route.client.dialer,
                service: service,
                head: head,
                body: body,
                idleTimeout: OverlayClient.idleTimeout(request)
            )
            defer { exchange.close() }
            let upload = Task {
                do {
                    try await exchange.send(body)
                } catch {
                    exchange.close()
                }
            }
            defer { upload.cancel() }
            while let part = try await exchange.next() {
                switch part {
                case .head(let responseHead):
                    let response = try OverlayClient.response(
                        responseHead,
                        url: url ?? URL(string: "http://\(service)/")!
                    )
                    report { $0.urlProtocol(self, didReceive: response, cacheStoragePolicy: .notAllowed) }
                case .body(let buffer):
                    let data = Data(buffer.readableBytesView)
                    report { $0.urlProtocol(self, didLoad: data) }
                case .end:
                    break
                }
            }
            report { $0.urlProtocolDidFinishLoading(self) }
        } catch {
            let failure = OverlayURLError.make(error, url: url)
            report { $0.urlProtocol(self, didFailWithError: failure) }
        }
    }
}

/// The hosts `OverlayURLProtocol` takes, each with the service it names and the client that dials it.
///
/// A routed host stays taken until `remove` is called: a request for it never falls through to URLSession's own
/// networking (which would send it, unencrypted and outside the overlay, to whatever that name resolves to).
public final class OverlayRoutes: Sendable {
    struct Route: Sendable {
        let client: OverlayClient
        let service: String
    }

    private let table = NIOLockedValueBox<[String: Route]>([:])

    /// Sends requests for each host in `hosts` to its service through `client`. Hosts are matched without case.
    public func add(_ hosts: [String: String], through client: OverlayClient) {
        table.withLockedValue { table in
            for (host, service) in hosts { table[host.lowercased()] = Route(client: client, service: service) }
        }
    }

    /// Stops routing `hosts`.
    public func remove(_ hosts: [String]) {
        table.withLockedValue { table in
            for host in hosts { table[host.lowercased()] = nil }
        }
    }

    func route(for url: URL?) -> Route? {
        guard let url, let scheme = url.scheme?.lowercased(), scheme == "http" || scheme == "https",
            let host = url.host?.lowercased()
        else { return nil }
        return table.withLockedValue { $0[host] }
    }
}

extension OverlayClient {
    /// A session configuration whose requests to `routes`' hosts go through this client: `routes` maps a URL host
    /// to a service name. Everything else in `base` is kept; URLSession's own protocols serve other hosts.
    public func sessionConfiguration(
        routes: [String: String],
        base: URLSessionConfiguration = .default
    ) -> URLSessionConfiguration {
        OverlayURLProtocol.routes.add(routes, through: self)
        // A copy: the caller's `base` is left as it was.
        let configuration = (base.copy() as? URLSessionConfiguration) ?? base
        configuration.protocolClasses = [OverlayURLProtocol.self] + (base.protocolClasses ?? [])
        return configuration
    }

    /// A session configuration where a URL's host is the service name: `http://claude-api/...` goes to
    /// `claude-api`.
    public func sessionConfiguration(
        services: [String],
        base: URLSessionConfiguration = .default
    ) -> URLSessionConfiguration {
        sessionConfiguration(
            routes: Dictionary(services.map { ($0, $0) }, uniquingKeysWith: { first, _ in first }),
            base: base
        )
    }
}
