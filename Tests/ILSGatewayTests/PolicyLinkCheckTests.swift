import Foundation
import ILSCore
import ILSCrypto
import ILSFabric
import ILSTesting
import Logging
import NIOConcurrencyHelpers
import NIOCore
import NIOEmbedded
import NIOHPACK
import NIOHTTP2
import NIOSSL
import Testing

@testable import ILSGateway

/// A policy link's certificate checks, with the controller's side of the control stream played by hand on an
/// `EmbeddedChannel` (virtual time: the timeout is tested without waiting for it).
@Suite("The policy link's certificate checks")
struct PolicyLinkCheckTests {
    struct Setup {
        let link: PolicyLink
        let stream: EmbeddedChannel
        let loop: EmbeddedEventLoop
        let peer: IdentityCertificate
        let policy: GatewayPolicy
    }

    /// A link bound on `stream` (control headers answered, dial policy received), and a device's certificate; with
    /// `bind` false, the stream is never opened.
    func bound(bind: Bool = true, grant: [String]? = nil) throws -> Setup {
        let authority = try CertificateAuthority.create(name: "test CA")
        let (gatewayPEM, gatewayKey) = try TestIdentities.issue(authority, name: "web", role: .gateway)
        let identity = IdentityFile(
            controller: "https://127.0.0.1:1",
            identity: IdentityRecord(
                id: "id-web",
                name: "web",
                role: .gateway,
                attributes: [],
                state: .active,
                createdAt: 0
            ),
            certificate: gatewayPEM,
            caCertificate: authority.certificatePEM,
            privateKey: gatewayKey.privateKeyPEM
        )
        let policy = GatewayPolicy()
        let link = try PolicyLink(
            identity: identity,
            service: "claude-api",
            policy: policy,
            grace: .seconds(60),
            logger: Logger(label: "test", factory: { _ in SwiftLogNoOpLogHandler() })
        )
        let loop = EmbeddedEventLoop()
        link.dialling()
        let stream = EmbeddedChannel(handler: link.router(), loop: loop)
        let (devicePEM, _) = try TestIdentities.issue(authority, name: "laptop", role: .device)
        let der = try NIOSSLCertificate(bytes: Array(devicePEM.utf8), format: .pem).toDERBytes()
        let peer = try IdentityCertificate(der: der)
        guard bind else { return Setup(link: link, stream: stream, loop: loop, peer: peer, policy: policy) }
        try stream.writeInbound(
            HTTP2Frame.FramePayload.headers(.init(headers: [":method": "GET", ":path": FabricProtocol.controlPath]))
        )
        try push(
            stream,
            HostControlMessage(
                dialRoles: [.device],
                blocked: [],
                dialGrant: grant.map { DialGrant(service: "claude-api", policy: "test", identities: $0) }
            )
        )
        while try stream.readOutbound(as: HTTP2Frame.FramePayload.self) != nil {}
        return Setup(link: link, stream: stream, loop: loop, peer: peer, policy: policy)
    }

    /// A control message from the controller, as a JSON line on the control stream.
    func push(_ stream: EmbeddedChannel, _ message: HostControlMessage) throws {
        var line = try JSONEncoder().encode(message)
        line.append(UInt8(ascii: "\n"))
        try stream.writeInbound(HTTP2Frame.FramePayload.data(.init(data: .byteBuffer(ByteBuffer(bytes: line)))))
    }

    /// The check line the link wrote on the control stream.
    func sentCheck(_ stream: EmbeddedChannel) throws -> CertificateCheck {
        guard case .data(let data) = try stream.readOutbound(as: HTTP2Frame.FramePayload.self),
            case .byteBuffer(let body) = data.data
        else { throw ILSError(.internalError, "no check was written") }
        return try JSONDecoder().decode(CertificateCheck.self, from: Data(String(buffer: body).utf8.dropLast()))
    }

    func answer(_ stream: EmbeddedChannel, _ verdict: CertificateVerdict) throws {
        var line = try JSONEncoder().encode(verdict)
        line.append(UInt8(ascii: "\n"))
        try stream.writeInbound(HTTP2Frame.FramePayload.data(.init(data: .byteBuffer(ByteBuffer(bytes: line)))))
    }

    @Test("the controller's verdict decides: allowed with its dial decision (absent from older ones), or refused")
    func verdicts() throws {
        let setup = try bound()
        let result = NIOLockedValueBox<[PolicyLink.CheckResult]>([])
        for (allowed, dial) in [(true, true), (true, false), (true, nil), (false, nil)] as [(Bool, Bool?)] {
            setup.link.check(setup.peer, on: setup.loop).whenSuccess { value in
                result.withLockedValue { $0.append(value) }
            }
            let check = try sentCheck(setup.stream)
            #expect(check.id == setup.peer.id && check.fingerprint == setup.peer.fingerprint)
            try answer(
                setup.stream,
                CertificateVerdict(
                    verdict: check.check,
                    allowed: allowed,
                    reason: allowed ? nil : "no longer valid",
                    dial: dial
                )
            )
            setup.loop.run()
        }
        #expect(
            result.withLockedValue { $0 } == [
                .allowed(dial: true), .allowed(dial: false), .allowed(dial: nil), .refused(reason: "no longer valid"),
            ]
        )
        _ = try? setup.stream.finish()
    }

    /// The answer and the grants share the control stream; the identity joins the grant as the answer is read, so a
    /// narrowing that follows the answer on the stream is applied after it and takes the identity out again.
    @Test("an answer that the identity may dial puts it in the grant, in stream order: a narrowing after it wins")
    func dialAnswerJoinsTheGrantInStreamOrder() throws {
        for narrowedAfter in [false, true] {
            let setup = try bound(grant: [])
            let admits = { () -> Bool in
                if case .allow = setup.policy.decide(setup.peer, service: "claude-api", hosted: "claude-api") {
                    return true
                }
                return false
            }
            #expect(!admits())
            setup.link.check(setup.peer, on: setup.loop).whenSuccess { _ in }
            let check = try sentCheck(setup.stream)
            try answer(setup.stream, CertificateVerdict(verdict: check.check, allowed: true, dial: true))
            if narrowedAfter {
                try push(
                    setup.stream,
                    HostControlMessage(
                        blocked: [],
                        dialGrant: DialGrant(service: "claude-api", policy: "test", identities: [])
                    )
                )
            }
            setup.loop.run()
            #expect(admits() == !narrowedAfter)
            _ = try? setup.stream.finish()
        }
    }

    /// A linked controller that does not answer must not let the client in unchecked.
    @Test("no answer in time is .noAnswer, which the gate turns into a 503, never an unchecked admission")
    func noAnswer() throws {
        let setup = try bound()
        let result = NIOLockedValueBox<PolicyLink.CheckResult?>(nil)
        setup.link.check(setup.peer, on: setup.loop).whenSuccess { value in result.withLockedValue { $0 = value } }
        _ = try sentCheck(setup.stream)
        setup.loop.advanceTime(by: PolicyLink.checkTimeout - .milliseconds(1))
        #expect(result.withLockedValue { $0 } == nil)
        setup.loop.advanceTime(by: .milliseconds(2))
        #expect(result.withLockedValue { $0 } == .noAnswer)
        _ = try? setup.stream.finish()
    }

    @Test("without a bound link the check is .unavailable at once, and the local decision stands")
    func unbound() throws {
        let setup = try bound(bind: false)
        let result = NIOLockedValueBox<PolicyLink.CheckResult?>(nil)
        setup.link.check(setup.peer, on: setup.loop).whenSuccess { value in result.withLockedValue { $0 = value } }
        #expect(result.withLockedValue { $0 } == .unavailable)
        #expect(try setup.stream.readOutbound(as: HTTP2Frame.FramePayload.self) == nil)
        _ = try? setup.stream.finish()
    }
}
