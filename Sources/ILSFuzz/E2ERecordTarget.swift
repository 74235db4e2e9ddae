import ILSCrypto
import ILSFabric
import ILSSodium
import NIOCore

/// The record decoder of an established circuit: `u8 suite ‖ the sender's header (the suite's length) ‖ framed
/// records`, opened with a fixed key by the same `E2ERecordLayer` the end-to-end handlers use, until the first record
/// that fails (which ends a circuit). Records after the FINAL one are still offered: they must be refused. A suite
/// byte that names no suite picks one by its remainder, so mutations of it still reach the records.
enum E2ERecordTarget {
    /// The fixed receive key; seeds are sealed with it.
    static let key = [UInt8](repeating: 0x5A, count: 32)
    /// A short key period, so long inputs cross a key change.
    static let recordsPerKey: UInt64 = 4

    static func suite(_ byte: UInt8) -> E2ESuite {
        E2ESuite(rawValue: byte) ?? E2ESuite.allCases[Int(byte) % E2ESuite.allCases.count]
    }

    static func run(_ data: UnsafeRawBufferPointer) {
        guard let first = data.first else { return }
        let suite = suite(first)
        let rest = data.dropFirst()
        guard rest.count >= suite.headerLength,
            let receiver = try? E2ERecordSuites.receiver(
                suite,
                key: key,
                header: Array(rest.prefix(suite.headerLength)),
                recordsPerKey: recordsPerKey
            )
        else { return }
        let fixtures = FuzzFixtures.shared
        let layer = E2ERecordLayer(
            session: E2ESession(
                sender: E2ERecordSuites.sender(suite, key: key),
                receiver: receiver,
                peer: fixtures.deviceCertificate,
                service: FuzzFixtures.service
            )
        )
        let allocator = ByteBufferAllocator()
        for record in CircuitFrames.decode(UnsafeRawBufferPointer(rebasing: rest.dropFirst(suite.headerLength))) {
            guard (try? layer.open(record, allocator: allocator)) != nil else { return }
        }
    }
}
