public import Foundation
public import ILSCore
import ILSIdentity
import NIOConcurrencyHelpers
import NIOCore
import NIOHTTP1

#if canImport(FoundationNetworking)
public import FoundationNetworking
#endif

/// An app's way into the overlay: HTTP requests to services, end-to-end encrypted to the gateway that hosts them,
/// through URLSession (`sessionConfiguration`) or an `async` API (`stream`).
///
/// A request names its service by its URL's host: `http://claude-api/claude/stream` goes to the service
/// `claude-api`, path `/claude/stream`. A session configuration can also route other hosts to a service
/// (`["api.example.com": "claude-api"]`), so the same URLs work in HTTP mode and through the overlay. The scheme
/// and port of the URL do not matter: the circuit is encrypted end to end whatever they say.
public final class OverlayClient: Sendable {
    /// The overlay connection this client dials through (one controller connection, one circuit per request).
    public let dialer: OverlayDialer
    /// Where a renewed identity goes (`init(store:)`); nil: the app renews by itself.
    private let store: (any IdentityStore)?
    private let renewal = NIOLockedValueBox(RenewalState())

    private struct RenewalState {
        /// The renewal under way: a second caller waits for it instead of starting another.
        var running: Task<Result<Bool, ILSError>, Never>?
        var handler: (@Sendable (IdentityFile) -> Void)?
    }

    public init(dialer: OverlayDialer) {
        self.dialer = dialer
        self.store = nil
    }

    public convenience init(identity: IdentityFile) throws(ILSError) {
        self.init(dialer: try OverlayDialer(identity: identity))
    }

    /// With the identity `store` holds; the cluster's controller list, as controllers name it on each circuit, is
    /// saved back there (`IdentityStore.learn`), so the app fails over to a replica that joined after it enrolled,
    /// on this launch and the next ones. The certificate is renewed through the store when it is due (a third of its
    /// life left), as the gateway and the tunnel renew theirs: checked as the client starts and as each request
    /// starts, in the background (`onIdentityRenewed` tells the app).
    public convenience init(store: any IdentityStore) throws(ILSError) {
        guard let identity = try store.load() else {
            throw ILSError(.notFound, "no identity is stored; enroll this device first")
        }
        try self.init(dialer: try OverlayDialer(identity: identity), store: store)
    }

    /// `init(store:)` with a dialer of the caller's (tests: its clock, its keepalive).
    package init(dialer: OverlayDialer, store: any IdentityStore) throws(ILSError) {
        self.dialer = dialer
        self.store = store
        dialer.onControllersLearned { learned in
            _ = try? store.learn(ControllerAddress.replicas(learned.controllers), certificate: learned.certificate)
        }
        renewInBackgroundIfDue()
    }

    /// Calls `body` with the new identity each time the client renews its certificate (already saved in the store
    /// and in use for new connections).
    public func onIdentityRenewed(_ body: @escaping @Sendable (IdentityFile) -> Void) {
        renewal.withLockedValue { $0.handler = body }
    }

    /// Renews the stored identity's certificate now if it is due: a new key pair made here, a new certificate from the
    /// controller over mTLS with the current one, saved in the store, used for new connections. Returns whether it
    /// renewed. An expired certificate cannot renew (`identity_expired`: a new enrollment is needed).
    @discardableResult
    public func renewIdentityIfDue() async throws(ILSError) -> Bool {
        try await renewalTask().value.get()
    }

    /// The renewal under way, or a new one. While it runs the dialer holds new circuits back
    /// (`OverlayDialer.renewIdentity`): the controller refuses the old certificate once it has issued the new one.
    private func renewalTask() -> Task<Result<Bool, ILSError>, Never> {
        renewal.withLockedValue { state in
            if let running = state.running { return running }
            // The task clears `running` under the same lock, so only after it has been set here.
            let task = Task { () -> Result<Bool, ILSError> in
                let result: Result<Bool, ILSError>
                do throws(ILSError) {
                    result = .success(try await self.renewNowIfDue())
                } catch {
                    result = .failure(error)
                }
                self.renewal.withLockedValue { $0.running = nil }
                return result
            }
            state.running = task
            return task
        }
    }

    private func renewNowIfDue() async throws(ILSError) -> Bool {
        guard let store, let file = try store.load(), Renewal.isDue(file, now: dialer.clock()) else { return false }
        if let notAfter = Renewal.expiry(of: file), notAfter <= dialer.clock() {
            throw Renewal.expired(file, on: notAfter)
        }
        let renewed = try await dialer.renewIdentity { () throws(ILSError) -> IdentityFile in
            let renewed = try await Renewal.renewed(file)
            try store.save(renewed)
            return renewed
        }
        renewal.withLockedValue { $0.handler }?(renewed)
        return true
    }

    /// Starts `renewIdentityIfDue` if the identity in use is due and none is running; a failure is tried again at the
    /// next request (whose circuit waits for it).
    private func renewInBackgroundIfDue() {
        guard store != nil, Renewal.isDue(notAfter: dialer.identityNotAfter, now: dialer.clock()) else { return }
        _ = renewalTask()
    }

    /// What the link to the overlay is doing, for a UI: the current state, then each change (`LinkState`).
    public var linkStates: AsyncStream<LinkState> { dialer.linkStates }

    /// The app's network path changed: circuits move to a new connection now (`OverlayDialer.networkChanged`).
    public func networkChanged() { dialer.networkChanged() }

    /// Waits until every circuit this client opened has ended on the wire, a cancelled task's CANCEL sent, for at
    /// most `bound`; false if some had not by then. Call it before the process exits or the app is suspended after
    /// cancelling tasks: otherwise the gateway may take the silence for a lost path and let the backend run on for
    /// its grace window (`OverlayDialer.circuitsEnded(within:)`).
    public func circuitsEnded(within bound: Duration = .seconds(2)) async -> Bool {
        await dialer.circuitsEnded(within: bound)
    }

    /// Sends `request` to `service` (the URL's host when nil) and returns once the response head has arrived.
    /// The body comes as it arrives, chunk by chunk, from `OverlayResponse.body`; cancelling the task that reads it
    /// (or dropping the response) closes the circuit, and the gateway then closes its backend connection.
    ///
    /// Failures are `URLError`s whose `ilsReason` is the overlay's reason (see `OverlayURLError`).
    public func stream(_ request: URLRequest, service: String? = nil) async throws(URLError) -> OverlayResponse {
        let url = request.url
        renewInBackgroundIfDue()
        do {
            let (head, service) = try Self.head(for: request, service: service)
            let body = OverlayRequestBody(request)
            let exchange = try await OverlayExchange.open(
                dialer: dialer,
                service: service,
                head: head,
                body: body,
                idleTimeout: Self.idleTimeout(request)
            )
            // The body goes on while the response is read: a backend may answer (or refuse) before it has read all
            // of it.
            Task {
                do {
                    try await exchange.send(body)
                } catch {
                    exchange.close()
                }
            }
            let handle = OverlayResponse.Handle(exchange)
            guard case .head(let responseHead) = try await exchange.next() else {
                throw OverlayURLError.make(code: "truncated", reason: "the circuit ended before a response", url: url)
            }
            return OverlayResponse(
                response: try Self.response(responseHead, url: url ?? URL(string: "http://\(service)/")!),
                body: OverlayResponse.Body(handle: handle, url: url)
            )
        } catch {
            throw OverlayURLError.make(error, url: url)
        }
    }

    /// The HTTP/1.1 head for `request`, and the service it goes to.
    static func head(for request: URLRequest, service: String?) throws(URLError) -> (HTTPRequestHead, String) {
        guard let url = request.url, let host = url.host, !host.isEmpty,
            let components = URLComponents(url: url, resolvingAgainstBaseURL: false)
        else {
            throw OverlayURLError.make(code: "invalid_url", reason: "the URL names no service", url: request.url)
        }
        var target = components.percentEncodedPath.isEmpty ? "/" : components.percentEncodedPath
        if let query = components.percentEncodedQuery { target += "?\(query)" }
        var headers = HTTPHeaders()
        headers.add(name: "Host", value: host)
        for (name, value) in request.allHTTPHeaderFields ?? [:] where name.lowercased() != "host" {
            headers.add(name: name, value: value)
        }
        let method = HTTPMethod(rawValue: request.httpMethod ?? "GET")
        if !headers.contains(name: "Content-Length"), !headers.contains(name: "Transfer-Encoding") {
            if let data = request.httpBody {
                headers.add(name: "Content-Length", value: String(data.count))
            } else if request.httpBodyStream != nil {
                headers.add(name: "Transfer-Encoding", value: "chunked")
            } else if method != .GET, method != .HEAD, method != .DELETE, method != .OPTIONS {
                headers.add(name: "Content-Length", value: "0")
            }
        }
        return (HTTPRequestHead(version: .http1_1, method: method, uri: target, headers: headers), service ?? host)
    }

    /// URLSession's meaning of `timeoutInterval`: the longest wait for the next bytes, not for the whole response.
    static func idleTimeout(_ request: URLRequest) -> TimeAmount {
        let seconds = request.timeoutInterval > 0 ? request.timeoutInterval : 60
        return .milliseconds(Int64(seconds * 1000))
    }

    static func response(_ head: HTTPResponseHead, url: URL) throws(URLError) -> HTTPURLResponse {
        var fields: [String: String] = [:]
        for (name, value) in head.headers {
            fields[name] = fields[name].map { "\($0), \(value)" } ?? value
        }
        guard
            let response = HTTPURLResponse(
                url: url,
                statusCode: Int(head.status.code),
                httpVersion: "HTTP/1.1",
                headerFields: fields
            )
        else {
            throw OverlayURLError.make(code: "invalid_response", reason: "the response head is not valid", url: url)
        }
        return response
    }
}
