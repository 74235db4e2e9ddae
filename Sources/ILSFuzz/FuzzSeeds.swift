import Foundation
import ILSCore
import ILSCrypto
import ILSFabric
import ILSSodium
import NIOCore
import NIOEmbedded
import NIOHPACK
import NIOHTTP2

/// Seed inputs for every target, made by the real code (the device's handshake, the token signer, the record
/// sealer, NIO's HTTP/2 client) plus hand-written requests and edge cases. `Tests/Fuzz/Corpus` holds one
/// generation of them; the signatures and ephemeral keys in them differ on every generation.
public enum FuzzSeeds {
    /// Target name → seeds, each with a file name.
    public static func generate() throws -> [String: [(name: String, bytes: [UInt8])]] {
        let fixtures = FuzzFixtures.shared
        let handshake = try handshakeMessages(fixtures)
        return [
            "fabric": try fabric(clientHello: handshake.hello),
            "e2e-handshake": [
                ("client-hello-finished", [0] + CircuitFrames.encode([handshake.hello, handshake.finished])),
                ("server-hello", [1] + CircuitFrames.encode([handshake.serverHello])),
                ("refusal", [1] + CircuitFrames.encode([E2EHandshake.refusal("dial_denied: not allowed")])),
                ("client-hello-only", [2] + CircuitFrames.encode([handshake.hello])),
            ],
            "e2e-records": records(),
            "enrollment": enrollment(fixtures),
            "controller-api": controllerAPI(fixtures),
            "proxy-request": proxyRequests(),
        ]
    }

    private static func handshakeMessages(
        _ fixtures: FuzzFixtures
    ) throws -> (hello: [UInt8], serverHello: [UInt8], finished: [UInt8]) {
        let initiator = E2EInitiator(credentials: fixtures.device.credentials, service: FuzzFixtures.service)
        let responder = E2EResponder(credentials: fixtures.gateway.credentials, versions: E2EHandshakeVersions.all)
        let hello = initiator.clientHello()
        let (serverHello, _, _) = try responder.receiveClientHello(hello, now: FuzzFixtures.now)
        let (finished, _) = try initiator.receiveServerHello(serverHello, now: FuzzFixtures.now)
        return (hello, serverHello, finished)
    }

    /// What a device's HTTP/2 client writes: the preface, its settings, and one CONNECT stream per circuit carrying
    /// `data`.
    private static func fabric(clientHello: [UInt8]) throws -> [(name: String, bytes: [UInt8])] {
        let framedHello = CircuitFrames.encode([clientHello])
        return [
            ("connect-client-hello", try http2Client(circuits: [("claude-api", framedHello)])),
            ("two-circuits", try http2Client(circuits: [("claude-api", framedHello), ("other", [0, 0, 0, 2, 1, 2])])),
            ("connect-no-data", try http2Client(circuits: [("claude-api", [])])),
            ("preface-only", try http2Client(circuits: [])),
        ]
    }

    private static func http2Client(circuits: [(service: String, data: [UInt8])]) throws -> [UInt8] {
        let channel = EmbeddedChannel()
        defer { _ = try? channel.finish(acceptAlreadyClosed: true) }
        let multiplexer = try channel.pipeline.syncOperations.configureFabricHTTP2(mode: .client)
        _ = channel.connect(to: try SocketAddress(ipAddress: "127.0.0.1", port: 8443))
        for (service, data) in circuits {
            multiplexer.createStreamChannel { $0.eventLoop.makeSucceededVoidFuture() }.whenSuccess { stream in
                let head = HPACKHeaders([(":method", "CONNECT"), (":authority", service)])
                stream.write(HTTP2Frame.FramePayload.headers(.init(headers: head)), promise: nil)
                if !data.isEmpty {
                    stream.write(
                        HTTP2Frame.FramePayload.data(.init(data: .byteBuffer(ByteBuffer(bytes: data)))),
                        promise: nil
                    )
                }
                stream.writeAndFlush(
                    HTTP2Frame.FramePayload.data(.init(data: .byteBuffer(ByteBuffer()), endStream: true)),
                    promise: nil
                )
            }
        }
        channel.embeddedEventLoop.run()
        var bytes: [UInt8] = []
        while let part = try channel.readOutbound(as: IOData.self) {
            if case .byteBuffer(let buffer) = part { bytes += buffer.readableBytesView }
        }
        return bytes
    }

    private static func records() -> [(name: String, bytes: [UInt8])] {
        func sealed(_ suite: E2ESuite, _ plaintexts: [String], final: Bool) -> [UInt8] {
            let sender = E2ERecordSuites.sender(
                suite,
                key: E2ERecordTarget.key,
                recordsPerKey: E2ERecordTarget.recordsPerKey
            )
            let layer = E2ERecordLayer(
                session: E2ESession(
                    sender: sender,
                    receiver: try! E2ERecordSuites.receiver(suite, key: E2ERecordTarget.key, header: sender.header),
                    peer: FuzzFixtures.shared.deviceCertificate,
                    service: FuzzFixtures.service
                )
            )
            var bytes = [suite.rawValue] + sender.header
            for (index, plaintext) in plaintexts.enumerated() {
                let last = index == plaintexts.count - 1
                layer.seal(ByteBuffer(string: plaintext), allocator: ByteBufferAllocator(), final: final && last) {
                    record,
                    _ in
                    bytes += record.readableBytesView
                }
            }
            return bytes
        }
        let events = (1...6).map { "data: event \($0)\n\n" }
        return E2ESuite.allCases.flatMap { suite in
            [
                (
                    "\(suite)-request-then-final",
                    sealed(suite, ["GET / HTTP/1.1\r\nHost: api\r\n\r\n", ""], final: true)
                ),
                (
                    "\(suite)-three-records",
                    sealed(suite, ["data: one\n\n", "data: two\n\n", "data: three\n\n"], final: false)
                ),
                ("\(suite)-across-a-key-change", sealed(suite, events, final: true)),
                ("\(suite)-empty-final", sealed(suite, [""], final: true)),
                ("\(suite)-header-only", sealed(suite, [], final: false)),
            ]
        }
    }

    private static func enrollment(_ fixtures: FuzzFixtures) -> [(name: String, bytes: [UInt8])] {
        let token = fixtures.deviceToken()
        let request = EnrollmentProof.makeRequest(token: token, keyPair: IdentityKeyPair.generate())
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        let body = (try? encoder.encode(request)).map(Array.init) ?? []
        let parts = token.split(separator: ".")
        let none = Base64URL.encode(Array(#"{"alg":"none","typ":"JWT"}"#.utf8)) + ".\(parts[1])."
        return [
            ("enroll-request", body),
            ("bare-token", Array(token.utf8)),
            ("alg-none", Array(#"{"token":"\#(none)","publicKey":"","proof":""}"#.utf8)),
            ("empty-object", Array("{}".utf8)),
        ]
    }

    /// `endpoint`'s request from the route table, as the caller (0: none, 1: admin, 2: gateway) sends it.
    private static func request(
        _ caller: UInt8,
        _ endpoint: ControllerEndpoint,
        name: String? = nil,
        query: [(String, String)] = [],
        body: String? = nil
    ) -> [UInt8] {
        let target = endpoint.path(name: name, query: query)
        var text = "\(endpoint.method) \(target) HTTP/1.1\r\nHost: 127.0.0.1:8443\r\n"
        if let body { text += "Content-Type: application/json\r\nContent-Length: \(body.utf8.count)\r\n" }
        text += "\r\n" + (body ?? "")
        return [caller] + Array(text.utf8)
    }

    private static func controllerAPI(_ fixtures: FuzzFixtures) -> [(name: String, bytes: [UInt8])] {
        let renewKey = IdentityKeyPair.generate()
        let proof = renewKey.sign(
            Array((ControllerAPI.RenewRequest.proofContext + fixtures.gateway.certificate.fingerprint).utf8)
        )
        let renew = #"{"publicKey":"\#(Base64URL.encode(renewKey.publicKey))","proof":"\#(Base64URL.encode(proof))"}"#
        let create = #"{"name":"new-device","role":"device","attributes":["team-a"],"tokenLifetimeSeconds":3600}"#
        return [
            ("health", request(0, .health)),
            ("enroll-info", request(0, .enrollInfo)),
            ("list-identities", request(1, .identities)),
            ("create-identity", request(1, .createIdentity, body: create)),
            ("get-identity", request(1, .identity, name: "laptop")),
            ("delete-identity", request(1, .deleteIdentity, name: "laptop")),
            (
                "reissue",
                request(1, .reissueIdentity, name: "gateway-1", body: #"{"tokenLifetimeSeconds":600}"#)
            ),
            ("revoke", request(1, .revokeIdentity, name: "gateway-1")),
            ("disable", request(1, .disableIdentity, name: "laptop")),
            ("enable", request(1, .enableIdentity, name: "laptop")),
            ("sessions", request(1, .sessions)),
            ("audit", request(1, .audit, query: [("since", "0"), ("x", "1")])),
            ("whoami", request(2, .whoami)),
            ("renew", request(2, .renew, body: renew)),
            ("admin-without-certificate", request(0, .identities)),
            ("pipelined", request(1, .health) + request(1, .sessions).dropFirst()),
            (
                "chunked",
                [1]
                    + Array(
                        "POST \(ControllerEndpoint.createIdentity.path()) HTTP/1.1\r\nHost: c\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n{\"nam\r\n0\r\n\r\n"
                            .utf8
                    )
            ),
        ]
    }

    private static func proxyRequests() -> [(name: String, bytes: [UInt8])] {
        func text(_ value: String) -> [UInt8] { Array(value.utf8) }
        return [
            ("get", text("GET /claude/stream?q=1 HTTP/1.1\r\nHost: api.example\r\nAccept: text/event-stream\r\n\r\n")),
            (
                "post-content-length",
                text(
                    "POST /claude/query HTTP/1.1\r\nHost: api\r\nContent-Type: application/json\r\nContent-Length: 13\r\n\r\n{\"prompt\":\"\"}"
                )
            ),
            (
                "post-chunked",
                text(
                    "POST /upload HTTP/1.1\r\nHost: api\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nabcd\r\n3;ext=1\r\nefg\r\n0\r\nTrailer: x\r\n\r\n"
                )
            ),
            (
                "pipelined-keep-alive",
                text("GET /a HTTP/1.1\r\nHost: api\r\n\r\nGET /b HTTP/1.1\r\nHost: api\r\nConnection: close\r\n\r\n")
            ),
            (
                "websocket-upgrade",
                text(
                    "GET /ws HTTP/1.1\r\nHost: api\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
                )
            ),
            (
                "websocket-then-frame",
                text("GET /ws HTTP/1.1\r\nHost: api\r\nConnection: upgrade\r\nUpgrade: websocket\r\n\r\n")
                    + [0x81, 0x05] + text("hello")
            ),
            ("absolute-form", text("GET http://other.example:8080/x HTTP/1.1\r\nHost: api\r\n\r\n")),
            ("options-star", text("OPTIONS * HTTP/1.1\r\nHost: api\r\n\r\n")),
            ("connect", text("CONNECT api:443 HTTP/1.1\r\nHost: api:443\r\n\r\n")),
            (
                "smuggling-cl-te",
                text("POST / HTTP/1.1\r\nHost: api\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n")
            ),
            (
                "hop-by-hop-and-forwarded",
                text(
                    "GET / HTTP/1.1\r\nHost: api\r\nConnection: keep-alive, X-Secret\r\nX-Secret: 1\r\nX-Forwarded-For: 6.6.6.6\r\nForwarded: for=6.6.6.6\r\nX-ILS-Identity: admin\r\nTE: trailers\r\n\r\n"
                )
            ),
            ("http10", text("GET / HTTP/1.0\r\n\r\n")),
            ("no-host", text("GET / HTTP/1.1\r\n\r\n")),
        ]
    }
}
