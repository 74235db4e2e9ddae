import CSodium
package import ILSCore
import ILSCrypto

/// One direction of an end-to-end encrypted circuit: libsodium's `crypto_secretstream_xchacha20poly1305`.
///
/// Each record is authenticated and bound to its position in the stream, so the relay cannot drop, reorder, replay
/// or splice records without the receiver noticing; the last record carries the FINAL tag, so a truncated stream is
/// told apart from a closed one.
package final class SecretStreamSender: E2ERecordSealing {
    private var state = crypto_secretstream_xchacha20poly1305_state()
    /// The 24-byte header the receiver needs first.
    package let header: [UInt8]

    package init(key: [UInt8]) {
        Sodium.ensureInitialized()
        precondition(key.count == crypto_secretstream_xchacha20poly1305_keybytes())
        var header = [UInt8](repeating: 0, count: crypto_secretstream_xchacha20poly1305_headerbytes())
        crypto_secretstream_xchacha20poly1305_init_push(&state, &header, key)
        self.header = header
    }

    /// Encrypts one record. `final` marks the end of the stream.
    package func seal(_ plaintext: [UInt8], final: Bool = false) -> [UInt8] {
        var ciphertext = [UInt8](repeating: 0, count: plaintext.count + SecretStream.overhead)
        let tag = final ? UInt8(crypto_secretstream_xchacha20poly1305_tag_final()) : 0
        crypto_secretstream_xchacha20poly1305_push(
            &state,
            &ciphertext,
            nil,
            plaintext,
            UInt64(plaintext.count),
            nil,
            0,
            tag
        )
        return ciphertext
    }

    /// Encrypts `plaintext` straight into `output` (at least `plaintext.count + SecretStream.overhead` bytes), for
    /// callers that seal into their own buffers without an intermediate array.
    package func seal(_ plaintext: UnsafeRawBufferPointer, into output: UnsafeMutableRawBufferPointer, final: Bool) {
        precondition(output.count >= plaintext.count + SecretStream.overhead)
        let tag = final ? UInt8(crypto_secretstream_xchacha20poly1305_tag_final()) : 0
        _ = withUnsafeTemporaryAllocation(of: UInt8.self, capacity: 1) { empty in
            crypto_secretstream_xchacha20poly1305_push(
                &state,
                output.baseAddress!.assumingMemoryBound(to: UInt8.self),
                nil,
                plaintext.baseAddress?.assumingMemoryBound(to: UInt8.self) ?? UnsafePointer(empty.baseAddress!),
                UInt64(plaintext.count),
                nil,
                0,
                tag
            )
        }
    }
}

package final class SecretStreamReceiver: E2ERecordOpening {
    private var state = crypto_secretstream_xchacha20poly1305_state()
    package private(set) var finished = false

    package init(key: [UInt8], header: [UInt8]) throws(ILSError) {
        Sodium.ensureInitialized()
        guard key.count == crypto_secretstream_xchacha20poly1305_keybytes(),
            header.count == crypto_secretstream_xchacha20poly1305_headerbytes(),
            crypto_secretstream_xchacha20poly1305_init_pull(&state, header, key) == 0
        else { throw SecretStream.invalid }
    }

    /// Decrypts the next record; throws if it was altered, reordered, replayed, or comes after the final one.
    package func open(_ ciphertext: [UInt8]) throws(ILSError) -> (plaintext: [UInt8], final: Bool) {
        guard !finished, ciphertext.count >= SecretStream.overhead else { throw SecretStream.invalid }
        var plaintext = [UInt8](repeating: 0, count: ciphertext.count - SecretStream.overhead)
        var tag: UInt8 = 0
        let result = crypto_secretstream_xchacha20poly1305_pull(
            &state,
            &plaintext,
            nil,
            &tag,
            ciphertext,
            UInt64(ciphertext.count),
            nil,
            0
        )
        guard result == 0 else { throw SecretStream.invalid }
        let final = tag == UInt8(crypto_secretstream_xchacha20poly1305_tag_final())
        if final { finished = true }
        return (plaintext, final)
    }

    /// Decrypts `ciphertext` straight into `output` (at least `ciphertext.count - SecretStream.overhead` bytes);
    /// returns whether it was the FINAL record. Same refusals as `open(_:)`.
    package func open(
        _ ciphertext: UnsafeRawBufferPointer,
        into output: UnsafeMutableRawBufferPointer
    ) throws(ILSError) -> Bool {
        guard !finished, ciphertext.count >= SecretStream.overhead,
            output.count >= ciphertext.count - SecretStream.overhead
        else { throw SecretStream.invalid }
        var tag: UInt8 = 0
        let result = withUnsafeTemporaryAllocation(of: UInt8.self, capacity: 1) { empty in
            crypto_secretstream_xchacha20poly1305_pull(
                &state,
                output.baseAddress?.assumingMemoryBound(to: UInt8.self) ?? empty.baseAddress!,
                nil,
                &tag,
                ciphertext.baseAddress!.assumingMemoryBound(to: UInt8.self),
                UInt64(ciphertext.count),
                nil,
                0
            )
        }
        guard result == 0 else { throw SecretStream.invalid }
        let final = tag == UInt8(crypto_secretstream_xchacha20poly1305_tag_final())
        if final { finished = true }
        return final
    }
}

package enum SecretStream {
    /// Bytes a record adds to its plaintext.
    package static let overhead = crypto_secretstream_xchacha20poly1305_abytes()
    package static let keyLength = crypto_secretstream_xchacha20poly1305_keybytes()
    package static let headerLength = crypto_secretstream_xchacha20poly1305_headerbytes()

    /// The refusal for a record that fails authentication (altered, reordered, replayed, after FINAL).
    static var invalid: ILSError { E2ERecord.invalidRecord }
}
