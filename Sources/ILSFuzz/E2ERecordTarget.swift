import ILSCrypto
import ILSFabric
import NIOCore

/// The record decoder of an established circuit: `header (24 bytes) ‖ framed records`, opened with a fixed key by
/// the same `E2ERecordLayer` the end-to-end handlers use, until the first record that fails (which ends a circuit).
/// Records after the FINAL one are still offered: they must be refused.
enum E2ERecordTarget {
    /// The fixed receive key; seeds are sealed with it.
    static let key = [UInt8](repeating: 0x5A, count: SecretStream.keyLength)

    static func run(_ data: UnsafeRawBufferPointer) {
        guard data.count >= SecretStream.headerLength,
            let receiver = try? SecretStreamReceiver(key: key, header: Array(data.prefix(SecretStream.headerLength)))
        else { return }
        let fixtures = FuzzFixtures.shared
        let layer = E2ERecordLayer(
            session: E2ESession(
                sender: SecretStreamSender(key: key),
                receiver: receiver,
                peer: fixtures.deviceCertificate,
                service: FuzzFixtures.service
            )
        )
        let allocator = ByteBufferAllocator()
        for record in CircuitFrames.decode(UnsafeRawBufferPointer(rebasing: data.dropFirst(SecretStream.headerLength)))
        {
            guard (try? layer.open(record, allocator: allocator)) != nil else { return }
        }
    }
}
