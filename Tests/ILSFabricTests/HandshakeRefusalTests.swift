import ILSCore
import ILSCrypto
import ILSFabric
import ILSTesting
import NIOCore
import NIOEmbedded
import Testing

/// A ClientHello the gateway cannot answer gets the documented refusal frame (`0x7F`, reason), not a bare reset.
@Suite("The gateway's refusal of a hello it cannot answer")
struct HandshakeRefusalTests {
    /// What the gateway writes back for `hello` (one framed message), as `(type, reason)`, and whether it closed.
    static func answer(to patch: (inout [UInt8]) -> Void) throws -> (reason: String?, closed: Bool) {
        let authority = try CertificateAuthority.create(name: "test CA")
        let device = try TestIdentities.credentials(authority, name: "ipad", role: .device)
        var hello = E2EInitiator(credentials: device, service: "claude-api").clientHello()
        patch(&hello)
        let gateway = EmbeddedChannel(handlers: [
            ByteToMessageHandler(FrameDecoder()),
            E2EResponderHandler(
                credentials: try TestIdentities.credentials(authority, name: "gw", role: .gateway),
                authorize: { _, _ in .allow },
                onEstablished: { _, _ in }
            ),
        ])
        defer { _ = try? gateway.finish(acceptAlreadyClosed: true) }
        try gateway.connect(to: SocketAddress(ipAddress: "127.0.0.1", port: 1)).wait()
        var frame = ByteBuffer()
        frame.writeInteger(UInt32(hello.count))
        frame.writeBytes(hello)
        try gateway.writeInbound(frame)
        gateway.embeddedEventLoop.run()
        guard var written = try gateway.readOutbound(as: ByteBuffer.self),
            let length = written.readInteger(as: UInt32.self), let body = written.readBytes(length: Int(length))
        else { return (nil, !gateway.isActive) }
        return (E2EHandshake.refusalReason(body), !gateway.isActive)
    }

    @Test("a hello offering no suite the gateway accepts is refused with the reason, on the wire")
    func noSuiteInCommon() throws {
        // The hello ends with `var suites`: its last bytes are the suite list (most preferred first).
        let (reason, closed) = try Self.answer { hello in
            let count = E2EHandshake.version.suites.count
            for index in (hello.count - count)..<hello.count { hello[index] = 0x09 }
        }
        #expect(reason?.contains("offers no record protection this gateway accepts") == true)
        #expect(closed)
    }

    @Test("a hello of a version the gateway does not speak is refused with the reason, on the wire")
    func unsupportedVersion() throws {
        let (reason, closed) = try Self.answer { hello in hello[1] = 9 }
        #expect(reason?.contains("version 9 is not supported") == true)
        #expect(closed)
    }
}
