import ArgumentParser
import ILSClient
import ILSCore

/// `ils-gateway enroll`: turn a one-time token into an identity file, on the device.
struct EnrollCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "enroll",
        abstract: "Enroll this machine: make its key pair and turn a one-time token into an identity file.",
        discussion: """
            The key pair is made here (libsodium Ed25519) and the private key never leaves this machine. The
            controller is reached over TLS pinned to the CA fingerprint inside the token. The identity file is written
            atomically with mode 0600; an existing file is never replaced without --force.

            Exit status on refusal: 80 malformed token, 81 wrong algorithm, 82 bad signature, 83 expired, 84 already
            used, 85 unknown to the controller, 86 wrong issuer, 87 CA fingerprint mismatch, 88 bad key proof,
            69 controller unreachable, 79 output file exists.

            Examples:
              ils-gateway enroll ipad.jwt
              ils-gateway enroll "$(cat laptop.jwt)" --out ~/.config/ils/laptop.json
            """
    )

    @Argument(help: "The enrollment token, or a file that holds it.")
    var token: String

    @Option(help: "Where to write the identity file. Default: identities/NAME.json.")
    var out: String?

    @Flag(help: "Replace an existing identity file.")
    var force = false

    func run() async throws {
        let token = try Enrollment.readToken(token)
        let result = try await Enrollment.enroll(token: token, outputPath: out, force: force)
        let identity = result.file.identity
        print("enrolled \(identity.name) (\(identity.role.rawValue)), identity written to \(result.path)")
    }
}
