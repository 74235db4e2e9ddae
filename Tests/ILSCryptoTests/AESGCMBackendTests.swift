import Crypto
import Testing

@testable import ILSCrypto

// Only where both backends exist: elsewhere (Apple systems) records take the Swift-API path alone.
#if canImport(CCryptoBoringSSL) && !ILS_APPLE_CODE_PATH
/// On Linux, AES-GCM records are sealed and opened through BoringSSL's AEAD in place; on Apple systems through
/// swift-crypto's Swift API (CryptoKit). Both must make and take the same bytes.
@Suite("AES-GCM record backends")
struct AESGCMBackendTests {
    @Test("the in-place AEAD and the Swift API seal the same bytes, open each other's records, and refuse a tamper")
    func backendsAgree() {
        let key = SymmetricKey(size: .bits256)
        for (index, length) in [0, 1, 17, 4096, 65536].enumerated() {
            let plaintext = (0..<length).map { UInt8(truncatingIfNeeded: $0 &* 31 &+ index) }
            let nonce = (0..<12).map { UInt8(truncatingIfNeeded: $0 &+ index) }
            let flags = UInt8(index % 2)
            let inPlace = Self.seal(plaintext, flags: flags, key: key, nonce: nonce, swiftAPI: false)
            let swiftAPI = Self.seal(plaintext, flags: flags, key: key, nonce: nonce, swiftAPI: true)
            #expect(inPlace == swiftAPI, "length \(length)")
            for useSwiftAPI in [false, true] {
                #expect(
                    Self.open(inPlace, flags: flags, key: key, nonce: nonce, swiftAPI: useSwiftAPI) == plaintext
                )
                var tampered = inPlace
                tampered.tag[index % 16] ^= 0x01
                #expect(Self.open(tampered, flags: flags, key: key, nonce: nonce, swiftAPI: useSwiftAPI) == nil)
                #expect(Self.open(inPlace, flags: flags ^ 1, key: key, nonce: nonce, swiftAPI: useSwiftAPI) == nil)
            }
        }
    }

    struct Sealed: Equatable {
        var ciphertext: [UInt8]
        var tag: [UInt8]
    }

    static func seal(_ plaintext: [UInt8], flags: UInt8, key: SymmetricKey, nonce: [UInt8], swiftAPI: Bool) -> Sealed {
        var sealed = Sealed(
            ciphertext: [UInt8](repeating: 0, count: plaintext.count),
            tag: [UInt8](repeating: 0, count: 16)
        )
        let seal = swiftAPI ? AESGCMRecords.sealWithSwiftAPI : AESGCMRecords.sealInPlace
        plaintext.withUnsafeBytes { plaintext in
            nonce.withUnsafeBytes { nonce in
                sealed.ciphertext.withUnsafeMutableBytes { ciphertext in
                    sealed.tag.withUnsafeMutableBytes { tag in
                        seal(plaintext, flags, key, nonce, ciphertext, tag)
                    }
                }
            }
        }
        return sealed
    }

    static func open(_ sealed: Sealed, flags: UInt8, key: SymmetricKey, nonce: [UInt8], swiftAPI: Bool) -> [UInt8]? {
        var output = [UInt8](repeating: 0, count: sealed.ciphertext.count)
        let flagBytes = [flags]
        let open = swiftAPI ? AESGCMRecords.openWithSwiftAPI : AESGCMRecords.openInPlace
        let opened = sealed.ciphertext.withUnsafeBytes { ciphertext in
            sealed.tag.withUnsafeBytes { tag in
                flagBytes.withUnsafeBytes { flags in
                    nonce.withUnsafeBytes { nonce in
                        output.withUnsafeMutableBytes { output in
                            open(ciphertext, tag, flags, key, nonce, output)
                        }
                    }
                }
            }
        }
        return opened ? output : nil
    }
}
#endif
