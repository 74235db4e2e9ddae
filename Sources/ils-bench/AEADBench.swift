import Crypto
import ILSCrypto

/// The two ways `AESGCMRecords` can seal and open a record, timed in one binary on the same buffers: BoringSSL's AEAD
/// in place (swift-crypto's internal `CCryptoBoringSSL` module) and swift-crypto's public `AES.GCM` API, which returns
/// a sealed box that is then copied into the record. Each round seals one record and opens it again, as the two ends
/// of a circuit do between them.
enum AEADBench {
    struct Result: Encodable {
        let implementation: String
        let recordBytes: Int
        /// Plaintext bytes sealed and opened per second, in GB (10⁹).
        let gbPerSecond: Double
        /// Nanoseconds for one seal plus one open.
        let nanosecondsPerRecord: Double
    }

    typealias Seal = (
        UnsafeRawBufferPointer, UInt8, SymmetricKey, UnsafeRawBufferPointer, UnsafeMutableRawBufferPointer,
        UnsafeMutableRawBufferPointer
    ) -> Void
    typealias Open = (
        UnsafeRawBufferPointer, UnsafeRawBufferPointer, UnsafeRawBufferPointer, SymmetricKey, UnsafeRawBufferPointer,
        UnsafeMutableRawBufferPointer
    ) -> Bool

    static var implementations: [(name: String, seal: Seal, open: Open)] {
        var all: [(name: String, seal: Seal, open: Open)] = [
            ("swift-crypto-api", AESGCMRecords.sealWithSwiftAPI, AESGCMRecords.openWithSwiftAPI)
        ]
        #if canImport(CCryptoBoringSSL) && !ILS_APPLE_CODE_PATH
        all.append(("boringssl-in-place", AESGCMRecords.sealInPlace, AESGCMRecords.openInPlace))
        #endif
        return all
    }

    static func run(seconds: Double, sizes: [Int], rounds: Int) -> [Result] {
        var results: [Result] = []
        // Alternate the implementations round by round, so a slow moment of a shared machine lands on both.
        for size in sizes {
            var best: [String: Double] = [:]
            for _ in 0..<rounds {
                for implementation in implementations {
                    let rate = measure(implementation.seal, implementation.open, size: size, seconds: seconds)
                    best[implementation.name] = max(best[implementation.name] ?? 0, rate)
                }
            }
            for implementation in implementations {
                let rate = best[implementation.name]!
                results.append(
                    Result(
                        implementation: implementation.name,
                        recordBytes: size,
                        gbPerSecond: rate * Double(size) / 1e9,
                        nanosecondsPerRecord: 1e9 / rate
                    )
                )
            }
        }
        return results
    }

    /// Records per second (each sealed and opened) over `seconds`.
    private static func measure(_ seal: Seal, _ open: Open, size: Int, seconds: Double) -> Double {
        let key = SymmetricKey(size: .bits256)
        let nonce: [UInt8] = Array(repeating: 7, count: 12)
        let plaintext = [UInt8](repeating: 0x61, count: size)
        var record = [UInt8](repeating: 0, count: size + 16)
        var opened = [UInt8](repeating: 0, count: size)
        var flags: UInt8 = 0
        let clock = ContinuousClock()
        let start = clock.now
        var count = 0
        while clock.now - start < .seconds(seconds) {
            for _ in 0..<64 {
                nonce.withUnsafeBytes { nonce in
                    plaintext.withUnsafeBytes { plaintext in
                        record.withUnsafeMutableBytes { record in
                            seal(
                                plaintext,
                                flags,
                                key,
                                nonce,
                                UnsafeMutableRawBufferPointer(rebasing: record[..<size]),
                                UnsafeMutableRawBufferPointer(rebasing: record[size...])
                            )
                        }
                    }
                    let authentic = record.withUnsafeBytes { record in
                        withUnsafeBytes(of: &flags) { flags in
                            opened.withUnsafeMutableBytes { output in
                                open(
                                    UnsafeRawBufferPointer(rebasing: record[..<size]),
                                    UnsafeRawBufferPointer(rebasing: record[size...]),
                                    flags,
                                    key,
                                    nonce,
                                    output
                                )
                            }
                        }
                    }
                    precondition(authentic, "a record did not open")
                }
            }
            count += 64
        }
        let elapsed = clock.now - start
        precondition(opened == plaintext, "a record did not open to its plaintext")
        return Double(count) / elapsed.seconds
    }
}
