import Foundation
public import ILSCore
import ILSCrypto
import NIOConcurrencyHelpers
public import NIOCore
public import NIOHTTP1
import NIOPosix
import NIOSSL
import X509

/// An HTTPS client of the controller API, for the CLI and for apps.
///
/// How the controller is trusted is explicit: either a CA certificate we already hold (from an identity file), or —
/// only during enrollment — a CA fingerprint from the enrollment token, checked against the chain the controller
/// presents before a single request byte is sent.
public struct ControllerClient: Sendable {
    public enum Trust: Sendable {
        /// The controller's CA, PEM, as stored in an identity file.
        case certificateAuthority(String)
        /// The SHA-256 fingerprint of the controller CA's DER (lowercase hex), from an enrollment token.
        case pinnedFingerprint(String)
    }

    /// A client certificate and key to present (mTLS), PEM.
    public struct ClientIdentity: Sendable {
        public var certificatePEM: String
        public var privateKeyPEM: String

        public init(certificatePEM: String, privateKeyPEM: String) {
            self.certificatePEM = certificatePEM
            self.privateKeyPEM = privateKeyPEM
        }
    }

    /// The largest response accepted from the controller.
    static let maximumResponseBytes = 8 * 1024 * 1024

    public let address: ControllerAddress
    /// The cluster's other controllers, tried in order when `address` cannot be reached at all. Only a connection
    /// that was never made moves on: once a request byte may have been sent, its answer (or its failure) is final,
    /// so a change is never sent twice.
    public var fallbacks: [ControllerAddress]
    public let trust: Trust
    public let identity: ClientIdentity?
    public var timeout: TimeAmount = .seconds(10)
    /// The cluster's controllers as the last answer named them, shared by every copy of this client: tried after
    /// `address` and `fallbacks`, so a long-lived client (the console) fails over to a replica that joined after it
    /// started.
    private let cluster = NIOLockedValueBox<[ControllerAddress]>([])
    /// Told the cluster's controllers whenever an answer names them (`ControllerAddress.listHeader`): `init(path:)`
    /// writes them into the identity file.
    public var learn: (@Sendable ([ControllerAddress]) -> Void)?

    public init(
        address: ControllerAddress,
        trust: Trust,
        identity: ClientIdentity? = nil,
        fallbacks: [ControllerAddress] = []
    ) {
        self.address = address
        self.trust = trust
        self.identity = identity
        self.fallbacks = fallbacks
    }

    /// An admin (or any identity) client from an identity file: its controller first, then the others it lists.
    public init(identityFile: IdentityFile) throws(ILSError) {
        try IdentityValidity.check(identityFile)
        let address = try ControllerAddress(parsing: identityFile.controller)
        self.init(
            address: address,
            trust: .certificateAuthority(identityFile.caCertificate),
            identity: ClientIdentity(certificatePEM: identityFile.certificate, privateKeyPEM: identityFile.privateKey),
            fallbacks: identityFile.controllerAddresses.filter { $0 != address }
        )
    }

    /// A client from the identity file at `path` that keeps the file's controller list current: every answer that
    /// names the cluster's controllers is written into the file (`IdentityFileIO.learn`), so the next command fails
    /// over to a replica that joined after the file was written (an admin file from `controller init` included).
    public init(path: String) throws(ILSError) {
        let file = try IdentityFileIO.read(path)
        try self.init(identityFile: file)
        let certificate = file.certificate
        learn = { IdentityFileIO.learn($0, path: path, certificate: certificate) }
    }

    /// The same identity and trust, speaking to `address` only (the CLI asks each controller of a cluster for what
    /// only that one knows: its live sessions).
    public func only(_ address: ControllerAddress) -> ControllerClient {
        var client = ControllerClient(address: address, trust: trust, identity: identity)
        client.timeout = timeout
        client.learn = learn
        return client
    }

    /// Sends `route`'s request (`name` in its path, `query` after it) with `body`, and decodes its answer; a refusal
    /// becomes the `ILSError` its code names.
    public func call<Body, Answer>(
        _ route: ControllerRoute<Body, Answer>,
        name: String? = nil,
        query: [(String, String)] = [],
        body: Body
    ) async throws(ILSError) -> Answer {
        try await call(route.method, route.endpoint.path(name: name, query: query), body: body, as: Answer.self)
    }

    /// `route`'s request, which has no body.
    public func call<Answer>(
        _ route: ControllerRoute<NoBody, Answer>,
        name: String? = nil,
        query: [(String, String)] = []
    ) async throws(ILSError) -> Answer {
        try await call(route.method, route.endpoint.path(name: name, query: query), as: Answer.self)
    }

    /// Sends a request to any path and decodes a JSON answer: the typed `call(_:name:query:body:)` underneath, and
    /// tests that probe paths the route table does not have.
    package func call<Response: Decodable>(
        _ method: HTTPMethod,
        _ path: String,
        body: (some Encodable)? = Optional<String>.none,
        as type: Response.Type = Response.self
    ) async throws(ILSError) -> Response {
        var data: Data?
        if let body {
            do {
                data = try JSONEncoder().encode(body)
            } catch {
                throw ILSError(.internalError, "could not encode the request")
            }
        }
        let (status, responseBody) = try await sendFailingOver(method, path, body: data)
        guard (200..<300).contains(status) else {
            throw Self.error(status: status, body: responseBody)
        }
        do {
            return try JSONDecoder().decode(Response.self, from: responseBody)
        } catch {
            throw ILSError(.unavailable, "the controller's answer to \(path) was not the expected JSON")
        }
    }

    /// The controller's refusal as an `ILSError`. Its sentence is printed as is by every command, so it is made
    /// safe here, where it enters: control characters escaped (`ControlCharacters`), at most 1,000 characters.
    static func error(status: Int, body: Data) -> ILSError {
        guard let error = try? JSONDecoder().decode(ControllerAPI.ErrorBody.self, from: body) else {
            return ILSError(.unavailable, "the controller answered HTTP \(status) without an explanation")
        }
        let reason = ControlCharacters.bounded(error.error, limit: 1000)
        if let refusal = EnrollmentRefusal(rawValue: error.code) {
            return ILSError(refusal.error.code, reason)
        }
        let known: [ILSError.Code] = [.invalidArgument, .invalidInput, .notFound, .permissionDenied, .conflict]
        let code = known.first { $0.name == error.code } ?? .unavailable
        return ILSError(code, reason)
    }

    /// `send` to `address`, then to each fallback in turn while the controller could not be connected to.
    func sendFailingOver(_ method: HTTPMethod, _ path: String, body: Data?) async throws(ILSError) -> (Int, Data) {
        var unreachable: [String] = []
        let learned = cluster.withLockedValue { $0 }
        for address in ControllerAddress.replicas(([address] + fallbacks + learned).map(\.description)) {
            do {
                return try await send(method, path, body: body, to: address)
            } catch let error as Unreachable {
                unreachable.append(error.reason)
            } catch {
                throw Self.asILSError(error)
            }
        }
        throw ILSError(.unavailable, unreachable.joined(separator: "; "))
    }

    /// The connection to a controller was never made: nothing was sent, so another controller may be asked.
    struct Unreachable: Error {
        var reason: String
    }

    private static func asILSError(_ error: any Error) -> ILSError {
        (error as? ILSError) ?? ILSError(.unavailable, "the controller request failed: \(describe(error))")
    }

    /// One request on a fresh TLS connection to `address`; `Unreachable` if no connection was made.
    private func send(_ method: HTTPMethod, _ path: String, body: Data?, to address: ControllerAddress)
        async throws(any Error)
        -> (Int, Data)
    {
        let sslContext = try makeSSLContext()
        let trust = self.trust
        let host = address.host
        let collector = ResponseCollector.Box()
        // Set only when the pinned check itself refused the controller's chain: any other TLS failure (a peer that
        // hangs up mid-handshake) means "unreachable", not "this token names another CA".
        let pinRefused = NIOLockedValueBox(false)
        let channel: any Channel
        do {
            channel = try await ClientBootstrap(group: MultiThreadedEventLoopGroup.singleton)
                .connectTimeout(timeout)
                .channelInitializer { channel in
                    channel.eventLoop.makeCompletedFuture {
                        let hostname = ControllerClient.isIPAddress(host) ? nil : host
                        let handler: NIOSSLClientHandler
                        if case .pinnedFingerprint(let fingerprint) = trust {
                            handler = try NIOSSLClientHandler(
                                context: sslContext,
                                serverHostname: hostname,
                                customVerificationCallback: { certificates, promise in
                                    let checked = promise.futureResult.eventLoop.makePromise(
                                        of: NIOSSLVerificationResult.self
                                    )
                                    checked.futureResult.whenSuccess { result in
                                        if result == .failed { pinRefused.withLockedValue { $0 = true } }
                                    }
                                    checked.futureResult.cascade(to: promise)
                                    PinnedVerification.verify(
                                        certificates,
                                        fingerprint: fingerprint,
                                        host: host,
                                        promise: checked
                                    )
                                }
                            )
                        } else {
                            handler = try NIOSSLClientHandler(context: sslContext, serverHostname: hostname)
                        }
                        try channel.pipeline.syncOperations.addHandler(handler)
                        try channel.pipeline.syncOperations.addHTTPClientHandlers()
                        try channel.pipeline.syncOperations.addHandler(
                            ResponseCollector(box: collector, limit: Self.maximumResponseBytes)
                        )
                    }
                }
                .connect(host: address.host, port: address.port).get()
        } catch {
            throw Unreachable(reason: "could not reach the controller at \(address): \(Self.describe(error))")
        }
        var headers = HTTPHeaders()
        headers.add(name: "Host", value: "\(address.host):\(address.port)")
        headers.add(name: "Content-Type", value: "application/json")
        headers.add(name: "Content-Length", value: String(body?.count ?? 0))
        headers.add(name: "Connection", value: "close")
        channel.write(
            HTTPClientRequestPart.head(
                HTTPRequestHead(
                    version: .http1_1,
                    method: method,
                    uri: path,
                    headers: headers
                )
            ),
            promise: nil
        )
        if let body { channel.write(HTTPClientRequestPart.body(.byteBuffer(ByteBuffer(bytes: body))), promise: nil) }
        channel.writeAndFlush(HTTPClientRequestPart.end(nil), promise: nil)
        // Set when this deadline, not the controller, ended the connection: "closed early" would blame the controller.
        let timedOut = NIOLockedValueBox(false)
        let timeout = channel.eventLoop.scheduleTask(in: self.timeout) {
            timedOut.withLockedValue { $0 = true }
            channel.close(promise: nil)
        }
        defer { timeout.cancel() }
        do {
            let response = try await collector.future(on: channel.eventLoop).get()
            try? await channel.close()
            if let learned = response.controllers.map(ControllerAddress.list(header:)), !learned.isEmpty {
                cluster.withLockedValue { $0 = learned }
                learn?(learned)
            }
            return (response.status, response.body)
        } catch {
            if case .pinnedFingerprint = trust, error is NIOSSLError, pinRefused.withLockedValue({ $0 }) {
                // The chain did not lead to the CA the token pins: this is not the controller the token names.
                throw EnrollmentRefusal.caMismatch.error
            }
            if timedOut.withLockedValue({ $0 }) {
                throw ILSError(
                    .unavailable,
                    "the controller at \(address) did not answer within \(Self.seconds(self.timeout))"
                )
            }
            throw ILSError(.unavailable, "the controller at \(address) did not answer: \(Self.describe(error))")
        }
    }

    /// "10 s", "1.5 s": a deadline as an error message names it.
    static func seconds(_ amount: TimeAmount) -> String {
        let milliseconds = amount.nanoseconds / 1_000_000
        if milliseconds % 1000 == 0 { return "\(milliseconds / 1000) s" }
        return "\(Double(milliseconds) / 1000) s"
    }

    private func makeSSLContext() throws(ILSError) -> NIOSSLContext {
        var configuration = TLSConfiguration.makeClientConfiguration()
        configuration.minimumTLSVersion = .tlsv12
        configuration.applicationProtocols = ["http/1.1"]
        do {
            if case .certificateAuthority(let pem) = trust {
                configuration.trustRoots = .certificates(try NIOSSLCertificate.fromPEMBytes(Array(pem.utf8)))
            }
            if let identity {
                configuration.certificateChain = try NIOSSLCertificate.fromPEMBytes(Array(identity.certificatePEM.utf8))
                    .map { .certificate($0) }
                configuration.privateKey = .privateKey(
                    try NIOSSLPrivateKey(bytes: Array(identity.privateKeyPEM.utf8), format: .pem)
                )
                configuration.signingSignatureAlgorithms = [.ed25519]
            }
            return try NIOSSLContext(configuration: configuration)
        } catch {
            throw ILSError(.invalidInput, "the identity's certificate or key could not be loaded", detail: "\(error)")
        }
    }

    static func isIPAddress(_ host: String) -> Bool {
        ServerChainVerification.isIPAddress(host)
    }

    static func describe(_ error: any Error) -> String {
        if let tls = error as? NIOSSLError, case .handshakeFailed = tls {
            // Only a refused certificate means "not the controller expected"; a handshake cut short (the controller's
            // deadline on a loaded machine, a middlebox) is a reachability problem and says what happened.
            if "\(tls)".contains("CERTIFICATE_VERIFY_FAILED") {
                return "the TLS handshake failed (the controller's certificate is not the one expected)"
            }
            return "the TLS handshake failed (\(tls))"
        }
        if let error = error as? ILSError { return error.reason }
        return "\(error)"
    }
}

extension ControllerRoute {
    /// The route's method as NIO spells it.
    var method: HTTPMethod { HTTPMethod(rawValue: endpoint.method) }
}
