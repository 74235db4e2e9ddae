import ILSCore
import ILSCrypto
import Testing

@Suite("Controller secrets sealed for a joining replica (HPKE)")
struct ControllerSecretsTests {
    let secrets = ControllerSecrets(
        caKey: "-----BEGIN PRIVATE KEY-----\nca\n",
        tokenKey: "-----BEGIN PRIVATE KEY-----\nt\n"
    )

    @Test("the replica that made the one-time key opens them, for the address it asked for")
    func roundTrip() throws {
        let opener = ControllerSecrets.Opener()
        let sealed = try secrets.sealed(to: opener.publicKey, context: "https://ctl-b:7443")
        #expect(!String(decoding: sealed.ciphertext, as: UTF8.self).contains("BEGIN PRIVATE KEY"))
        let opened = try opener.open(
            encapsulatedKey: sealed.encapsulatedKey,
            ciphertext: sealed.ciphertext,
            context: "https://ctl-b:7443"
        )
        #expect(opened.caKey == secrets.caKey && opened.tokenKey == secrets.tokenKey)
    }

    @Test("another key, another address or a flipped byte opens nothing")
    func refusals() throws {
        let opener = ControllerSecrets.Opener()
        let sealed = try secrets.sealed(to: opener.publicKey, context: "https://ctl-b:7443")
        #expect(throws: ILSError.self) {
            try ControllerSecrets.Opener().open(
                encapsulatedKey: sealed.encapsulatedKey,
                ciphertext: sealed.ciphertext,
                context: "https://ctl-b:7443"
            )
        }
        #expect(throws: ILSError.self) {
            try opener.open(
                encapsulatedKey: sealed.encapsulatedKey,
                ciphertext: sealed.ciphertext,
                context: "https://x:1"
            )
        }
        var flipped = sealed.ciphertext
        flipped[flipped.count / 2] ^= 1
        #expect(throws: ILSError.self) {
            try opener.open(encapsulatedKey: sealed.encapsulatedKey, ciphertext: flipped, context: "https://ctl-b:7443")
        }
        #expect(throws: ILSError.self) { try secrets.sealed(to: [1, 2, 3], context: "x") }
    }
}
