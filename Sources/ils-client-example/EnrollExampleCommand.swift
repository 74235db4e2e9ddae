import ArgumentParser
import ILSClient
import ILSCore

/// `ils-client-example enroll`: a token that was pasted or scanned (or a file holding it) becomes an identity file.
struct EnrollExampleCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "enroll",
        abstract: "Enroll: make a key pair here and turn a one-time token into an identity file.",
        discussion: """
            TOKEN-OR-FILE is the token itself (whitespace around or inside it, as a paste or a scanner leaves, is \
            ignored) or a file that holds it. The key pair is made on this machine and never leaves it. The identity \
            file is written with mode 0600, atomically, and never over an existing file unless --force.
            """
    )

    @Argument(help: "The enrollment token, or a file that holds it.")
    var tokenOrFile: String

    @Option(help: "Where to write the identity file.")
    var out: String

    @Flag(help: "Replace an existing identity file.")
    var force = false

    func run() async throws {
        let token = try Enrollment.readToken(tokenOrFile)
        let result = try await Enrollment.enroll(token: token, outputPath: out, force: force)
        let identity = result.file.identity
        ExampleOutput.say(
            "enrolled \(ControlCharacters.escaped(identity.name)) (\(identity.role.rawValue)), identity written to \(result.path)"
        )
    }
}
