import ArgumentParser
import ILSCore
import ILSIdentity

/// `ils-gateway enroll`: turn a one-time token into an identity file, on the device.
struct EnrollCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "enroll",
        abstract: "Enroll this machine: make its key pair and turn a one-time token into an identity file.",
        discussion: """
            The key pair is made here (libsodium Ed25519) and the private key never leaves this machine. The
            controller is reached over TLS pinned to the CA fingerprint inside the token. The identity file is written
            atomically with mode 0600; an existing file is never replaced without --force. Room for it is taken on
            disk before the token is spent, so a full disk refuses with the token still usable.

            --pem also writes the certificate, key and CA as PEM files next to the identity file, for clients that
            cannot read it (curl --cert NAME.cert.pem --key NAME.key.pem --cacert NAME.ca.pem). Only at
            enrollment: the key file is a second copy of the private key, made once when asked for; after a renew,
            enroll again (reissue) to get PEM files for the new certificate.

            Exit status on refusal: 80 malformed token, 81 wrong algorithm, 82 bad signature, 83 expired, 84 already
            used, 85 unknown to the controller, 86 wrong issuer, 87 CA fingerprint mismatch, 88 bad key proof,
            69 controller unreachable, 79 output file exists.

            Examples:
              ils-gateway enroll ipad.jwt
              ils-gateway enroll "$(cat laptop.jwt)" --out ~/.config/ils/laptop.json
              ils-gateway enroll old-laptop.jwt --pem
            """
    )

    @Argument(
        help: "The enrollment token, its ils-enroll://v1/ URI (what a QR code carries), or a file holding either."
    )
    var token: String

    @Option(help: "Where to write the identity file. Default: identities/NAME.json.")
    var out: String?

    @Flag(help: "Replace an existing identity file (and PEM files with --pem).")
    var force = false

    @Flag(
        help: """
            Also write NAME.cert.pem, NAME.key.pem and NAME.ca.pem next to the identity file (mode 0600), for curl             and other clients of HTTP mode with client certificates.
            """
    )
    var pem = false

    func run() async throws {
        let token = try Enrollment.readToken(token)
        let result = try await Enrollment.enroll(token: token, outputPath: out, force: force, pem: pem)
        let identity = result.file.identity
        say("enrolled \(identity.name) (\(identity.role.rawValue)), identity written to \(result.path)")
        if !result.pemPaths.isEmpty {
            say("PEM files: \(result.pemPaths.joined(separator: ", ")) (the key file is a copy of the private key)")
        }
    }
}
