import ILSCrypto
import ILSFabric
import ILSSodium

/// The end-to-end handshake from both ends, each fed hostile messages in circuit frames.
///
/// The first byte picks the side: even, the gateway (responder) reads ClientHello then ClientFinished; odd, the
/// device (initiator) reads ServerHello or a refusal, speaking the version the next bits pick. The gateway answers
/// every version, as a real one does. Certificates are judged at `FuzzFixtures.now`.
enum E2EHandshakeTarget {
    static func run(_ data: UnsafeRawBufferPointer) {
        guard let side = data.first else { return }
        let frames = CircuitFrames.decode(UnsafeRawBufferPointer(rebasing: data.dropFirst()))
        let messages = frames.map { Array($0.readableBytesView) }
        let fixtures = FuzzFixtures.shared
        if side & 1 == 0 {
            let responder = E2EResponder(credentials: fixtures.gateway.credentials, versions: E2EHandshakeVersions.all)
            guard let hello = messages.first,
                (try? responder.receiveClientHello(hello, now: FuzzFixtures.now)) != nil
            else { return }
            for message in messages.dropFirst() { _ = try? responder.receiveClientFinished(message) }
        } else {
            let versions = E2EHandshakeVersions.all
            let initiator = E2EInitiator(
                credentials: fixtures.device.credentials,
                service: FuzzFixtures.service,
                version: versions[Int(side >> 1) % versions.count]
            )
            _ = initiator.clientHello()
            for message in messages {
                _ = E2EHandshake.refusalReason(message)
                _ = try? initiator.receiveServerHello(message, now: FuzzFixtures.now)
            }
        }
    }
}
