import Foundation
import ILSCore
import ILSCrypto
import ILSSodium
import ILSTesting
import Testing

/// A CA, a device and a gateway, as a controller would have enrolled them.
struct E2EParties {
    let authority: CertificateAuthority
    let device: E2EHandshake.Credentials
    let gateway: E2EHandshake.Credentials

    init() throws {
        authority = try CertificateAuthority.create(name: "test CA")
        device = try Self.credentials(authority, name: "ipad", role: .device)
        gateway = try Self.credentials(authority, name: "gw", role: .gateway)
    }

    /// Credentials issued by `authority`, trusting `trusting` (by default the same CA).
    static func credentials(
        _ authority: CertificateAuthority,
        name: String,
        role: IdentityRole,
        trusting: CertificateAuthority? = nil
    ) throws -> E2EHandshake.Credentials {
        try TestIdentities.credentials(authority, name: name, role: role, trusting: trusting)
    }

    /// The newest handshake version that agrees `suite`.
    static func version(for suite: E2ESuite) -> any E2EHandshakeVersion {
        E2EHandshakeVersions.all.last { $0.suites.contains(suite) }!
    }
}

@Suite("End-to-end handshake and records")
struct E2EHandshakeTests {
    @Test("device and gateway agree on keys and learn each other's verified identity")
    func handshake() throws {
        let parties = try E2EParties()
        let initiator = E2EInitiator(credentials: parties.device, service: "claude-api")
        let responder = E2EResponder(credentials: parties.gateway)
        let (serverHello, service, provisionalPeer) = try responder.receiveClientHello(initiator.clientHello())
        #expect(service == "claude-api")
        #expect(provisionalPeer.name == "ipad")
        let (finished, deviceSession) = try initiator.receiveServerHello(serverHello)
        let gatewaySession = try responder.receiveClientFinished(finished)
        #expect(deviceSession.peer.name == "gw")
        #expect(gatewaySession.peer.id == "id-ipad")

        let request = Array("GET /claude/stream HTTP/1.1\r\n\r\n".utf8)
        #expect(try gatewaySession.receiver.open(deviceSession.sender.seal(request)).plaintext == request)
        let answer = Array("data: hello\n\n".utf8)
        let sealed = gatewaySession.sender.seal(answer, final: true)
        #expect(!sealed.contains(subsequence: answer))
        let opened = try deviceSession.receiver.open(sealed)
        #expect(opened.plaintext == answer)
        #expect(opened.final)
    }

    @Test("a relay that substitutes the gateway's ephemeral key is caught by the device")
    func substitutedKeyFails() throws {
        let parties = try E2EParties()
        let initiator = E2EInitiator(credentials: parties.device, service: "claude-api")
        let responder = E2EResponder(credentials: parties.gateway)
        var serverHello = try responder.receiveClientHello(initiator.clientHello()).serverHello
        // Layout: type, version, suite, u16 cert length, cert, then the 32-byte ephemeral key.
        let certificateLength = Int(serverHello[3]) << 8 | Int(serverHello[4])
        let keyOffset = 5 + certificateLength
        for index in keyOffset..<(keyOffset + 32) { serverHello[index] ^= 0x5A }
        #expect(throws: ILSError.self) { _ = try initiator.receiveServerHello(serverHello) }
    }

    @Test("a relay that changes the service in the device's hello breaks the handshake")
    func changedServiceFails() throws {
        let parties = try E2EParties()
        let initiator = E2EInitiator(credentials: parties.device, service: "claude-api")
        let responder = E2EResponder(credentials: parties.gateway)
        var hello = initiator.clientHello()
        // Layout: type, version, u16 length, "claude-api". Make it "claude-apX": same length, other service.
        #expect(hello[13] == UInt8(ascii: "i"))
        hello[13] = UInt8(ascii: "X")
        let serverHello = try responder.receiveClientHello(hello).serverHello
        #expect(throws: ILSError.self) { _ = try initiator.receiveServerHello(serverHello) }
    }

    @Test("a replayed device hello and finished message cannot open a new circuit")
    func replayFails() throws {
        let parties = try E2EParties()
        let initiator = E2EInitiator(credentials: parties.device, service: "claude-api")
        let hello = initiator.clientHello()
        let first = E2EResponder(credentials: parties.gateway)
        let (finished, _) = try initiator.receiveServerHello(try first.receiveClientHello(hello).serverHello)
        _ = try first.receiveClientFinished(finished)
        // The relay records both and replays them to the gateway: the gateway's fresh nonce changes the transcript.
        let second = E2EResponder(credentials: parties.gateway)
        _ = try second.receiveClientHello(hello)
        #expect(throws: ILSError.self) { _ = try second.receiveClientFinished(finished) }
    }

    @Test("a certificate from another CA is refused, whoever presents it")
    func foreignCertificateRefused() throws {
        let parties = try E2EParties()
        // An impostor with a certificate from another CA, which itself accepts our devices.
        let stranger = try E2EParties.credentials(
            try CertificateAuthority.create(name: "other"),
            name: "gw",
            role: .gateway,
            trusting: parties.authority
        )
        let initiator = E2EInitiator(credentials: parties.device, service: "claude-api")
        let impostor = E2EResponder(credentials: stranger)
        let serverHello = try impostor.receiveClientHello(initiator.clientHello(), now: Date()).serverHello
        #expect(throws: ILSError.self) { _ = try initiator.receiveServerHello(serverHello) }
        let strangerDevice = E2EInitiator(credentials: stranger, service: "claude-api")
        #expect(throws: ILSError.self) {
            _ = try E2EResponder(credentials: parties.gateway).receiveClientHello(strangerDevice.clientHello())
        }
    }

    @Test("an expired peer certificate is refused")
    func expiredRefused() throws {
        let parties = try E2EParties()
        let initiator = E2EInitiator(credentials: parties.device, service: "claude-api")
        let later = Date().addingTimeInterval(CertificateAuthority.identityCertificateLifetime + 3600)
        #expect(throws: ILSError.self) {
            _ = try E2EResponder(credentials: parties.gateway).receiveClientHello(initiator.clientHello(), now: later)
        }
    }

    @Test("the device only accepts a gateway at the other end")
    func responderMustBeGateway() throws {
        let parties = try E2EParties()
        let otherDevice = try E2EParties.credentials(parties.authority, name: "phone", role: .device)
        let initiator = E2EInitiator(credentials: parties.device, service: "claude-api")
        let serverHello = try E2EResponder(credentials: otherDevice).receiveClientHello(initiator.clientHello())
            .serverHello
        #expect(throws: ILSError.self) { _ = try initiator.receiveServerHello(serverHello) }
    }

    @Test("altered, reordered, duplicated and post-final records are refused", arguments: E2ESuite.allCases)
    func recordIntegrity(suite: E2ESuite) throws {
        let parties = try E2EParties()
        let version = E2EParties.version(for: suite)
        let initiator = E2EInitiator(
            credentials: parties.device,
            service: "claude-api",
            version: version,
            suites: [suite]
        )
        let responder = E2EResponder(credentials: parties.gateway, versions: E2EHandshakeVersions.all)
        let (finished, device) = try initiator.receiveServerHello(
            try responder.receiveClientHello(initiator.clientHello()).serverHello
        )
        let gateway = try responder.receiveClientFinished(finished)
        #expect(device.suite == suite && gateway.suite == suite)
        let one = device.sender.seal(Array("one".utf8))
        let two = device.sender.seal(Array("two".utf8))
        var altered = one
        altered[altered.count - 1] ^= 1
        #expect(throws: ILSError.self) { _ = try gateway.receiver.open(altered) }

        // A fresh pair for each case: a failed open leaves the receiver unusable, as it should.
        func pair() throws -> (E2ESession, E2ESession) {
            let i = E2EInitiator(credentials: parties.device, service: "claude-api", version: version, suites: [suite])
            let r = E2EResponder(credentials: parties.gateway, versions: E2EHandshakeVersions.all)
            let (f, d) = try i.receiveServerHello(try r.receiveClientHello(i.clientHello()).serverHello)
            return (d, try r.receiveClientFinished(f))
        }
        let (d1, g1) = try pair()
        let first = d1.sender.seal([1])
        let second = d1.sender.seal([2])
        #expect(throws: ILSError.self) { _ = try g1.receiver.open(second) }  // reordered
        _ = first
        let (d2, g2) = try pair()
        let once = d2.sender.seal([1])
        _ = try g2.receiver.open(once)
        #expect(throws: ILSError.self) { _ = try g2.receiver.open(once) }  // duplicated
        let (d3, g3) = try pair()
        _ = try g3.receiver.open(d3.sender.seal([9], final: true))
        #expect(g3.receiver.finished)
        #expect(throws: ILSError.self) { _ = try g3.receiver.open(d3.sender.seal([10])) }  // after final
        _ = two
    }

    @Test("truncated and malformed handshake messages are refused without crashing", arguments: 0..<40)
    func malformedMessages(cut: Int) throws {
        let parties = try E2EParties()
        let initiator = E2EInitiator(credentials: parties.device, service: "claude-api")
        let hello = initiator.clientHello()
        let truncated = Array(hello.prefix(cut * hello.count / 40))
        #expect(throws: ILSError.self) {
            _ = try E2EResponder(credentials: parties.gateway).receiveClientHello(truncated)
        }
        #expect(throws: ILSError.self) {
            _ = try E2EResponder(credentials: parties.gateway).receiveClientHello(hello + [0])
        }
    }
}

extension Array where Element == UInt8 {
    func contains(subsequence: [UInt8]) -> Bool {
        guard subsequence.count <= count else { return false }
        for start in 0...(count - subsequence.count)
        where Array(self[start..<(start + subsequence.count)]) == subsequence {
            return true
        }
        return false
    }
}
