public import ArgumentParser
import Foundation
public import ILSCore
import ILSCrypto
import ILSIdentity
import ILSQRCode

extension IdentityRole: ExpressibleByArgument {}

/// `ils-gateway admin identity ...`
struct IdentityCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "identity",
        abstract: "Create, list, show, delete and reissue identities.",
        discussion: """
            Examples:
              ils-gateway admin identity create laptop --role device -o laptop.jwt
              ils-gateway admin identity list
            """,
        subcommands: [
            Create.self, List.self, Show.self, Update.self, Revoke.self, Disable.self, Enable.self, Delete.self,
            Reissue.self,
        ]
    )

    @ParentCommand var admin: AdminCommand

    struct Create: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Create an identity and print its one-time enrollment token.",
            discussion: """
                Example:
                  ils-gateway admin identity create ipad --role device -o ipad.jwt
                  # then, on the iPad's machine: ils-gateway enroll ipad.jwt
                """
        )

        @ParentCommand var identityCommand: IdentityCommand
        @OptionGroup var identityOption: AdminIdentityOption

        @Argument(help: "The identity's name: 1-64 letters, digits, '.', '_' or '-'.")
        var name: String

        @Option(help: "device (dials services), gateway (hosts them) or admin.")
        var role: IdentityRole

        @Option(help: "Comma-separated attributes for policies.")
        var attributes: String?

        @OptionGroup var tokenOptions: TokenOptions

        func run() async throws {
            try IdentityName.validate(name)
            let prepared = try tokenOptions.prepare()
            defer { prepared.abandon() }
            let lifetime = prepared.lifetimeSeconds
            let attributeList = (attributes ?? "").split(separator: ",").map {
                $0.trimmingCharacters(in: .whitespaces)
            }.filter { !$0.isEmpty }
            let client = try identityOption.client(parent: identityCommand.admin)
            let response = try await client.call(
                ControllerRoutes.createIdentity,
                body: ControllerAPI.CreateIdentityRequest(
                    name: name,
                    role: role,
                    attributes: attributeList,
                    tokenLifetimeSeconds: lifetime
                )
            )
            try emitToken(response, tokenOptions, into: prepared)
        }
    }

    struct List: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "List identities with role and state.",
            discussion: """
                Examples:
                  ils-gateway admin identity list
                  ils-gateway admin identity list --json
                """
        )

        @ParentCommand var identityCommand: IdentityCommand
        @OptionGroup var identityOption: AdminIdentityOption

        @Flag(help: "Print JSON.")
        var json = false

        func run() async throws {
            let client = try identityOption.client(parent: identityCommand.admin)
            let identities = try await client.call(ControllerRoutes.identities)
            if json {
                try printJSON(identities)
                return
            }
            say(
                cell("NAME", 20) + cell("ROLE", 9) + cell("STATE", 10) + cell("CERT EXPIRES", 22)
                    + cell("LAST SEEN", 22) + "ID"
            )
            for identity in identities {
                say(
                    cell(identity.name, 20) + cell(identity.role.rawValue, 9) + cell(identity.state.rawValue, 10)
                        + cell(formatTime(identity.certificateNotAfter), 22)
                        + cell(formatTime(identity.lastSeenAt), 22) + identity.id
                )
            }
        }
    }

    struct Show: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Show one identity.",
            discussion: """
                Example:
                  ils-gateway admin identity show ipad
                """
        )

        @ParentCommand var identityCommand: IdentityCommand
        @OptionGroup var identityOption: AdminIdentityOption

        @Argument(help: "The identity's name.")
        var name: String

        @Flag(help: "Print JSON.")
        var json = false

        func run() async throws {
            try IdentityName.validate(name)
            let client = try identityOption.client(parent: identityCommand.admin)
            let identity = try await client.call(ControllerRoutes.identity, name: name)
            if json {
                try printJSON(identity)
                return
            }
            say("name:        \(identity.name)")
            say("id:          \(identity.id)")
            say("role:        \(identity.role.rawValue)")
            say("state:       \(identity.state.rawValue)")
            say("attributes:  \(identity.attributes.joined(separator: ","))")
            say("created:     \(formatTime(identity.createdAt))")
            say("cert expiry: \(formatTime(identity.certificateNotAfter))")
            say("last seen:   \(formatTime(identity.lastSeenAt))")
        }
    }

    struct Update: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Replace an identity's attributes; circuits its new attributes no longer allow end now.",
            discussion: """
                Service policies match on attributes (#ipad). The list replaces the old one whole; '' clears it.
                Before the command returns, the identity's live circuits to any service whose dial policy no longer
                allows it end, on every controller, and gateways refuse its new ones.

                Examples:
                  ils-gateway admin identity update ipad --attributes ipad,home
                  ils-gateway admin identity update ipad --attributes ''
                """
        )

        @ParentCommand var identityCommand: IdentityCommand
        @OptionGroup var identityOption: AdminIdentityOption

        @Argument(help: "The identity's name.")
        var name: String

        @Option(help: "The new comma-separated attributes (at most 32; '' for none).")
        var attributes: String

        func run() async throws {
            try IdentityName.validate(name)
            let list = attributes.split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces) }
                .filter { !$0.isEmpty }
            for attribute in list { try IdentityName.validate(attribute) }
            let client = try identityOption.client(parent: identityCommand.admin)
            let identity = try await client.call(
                ControllerRoutes.identityAttributes,
                name: name,
                body: ControllerAPI.AttributesRequest(attributes: list)
            )
            say(
                "\(identity.name): attributes \(identity.attributes.isEmpty ? "none" : identity.attributes.joined(separator: ","))"
            )
        }
    }

    struct Revoke: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Revoke an identity for good: its live circuits end now, everywhere, and it never gets back in.",
            discussion: """
                Before the command returns, the controller closes the identity's connections and circuits and tells
                every gateway, which closes its circuits too and refuses new ones. A revoked device needs a new
                identity. Example:
                  ils-gateway admin identity revoke ipad
                """
        )

        @ParentCommand var identityCommand: IdentityCommand
        @OptionGroup var identityOption: AdminIdentityOption

        @Argument(help: "The identity's name.")
        var name: String

        func run() async throws {
            try await changeState(
                name,
                ControllerRoutes.revokeIdentity,
                identityOption.client(parent: identityCommand.admin)
            )
        }
    }

    struct Disable: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract:
                "Block an identity for now (e.g. a device left somewhere); its live circuits end. Undo with enable.",
            discussion: """
                Example:
                  ils-gateway admin identity disable ipad
                """
        )

        @ParentCommand var identityCommand: IdentityCommand
        @OptionGroup var identityOption: AdminIdentityOption

        @Argument(help: "The identity's name.")
        var name: String

        func run() async throws {
            try await changeState(
                name,
                ControllerRoutes.disableIdentity,
                identityOption.client(parent: identityCommand.admin)
            )
        }
    }

    struct Enable: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Let a disabled identity back in.",
            discussion: """
                Example:
                  ils-gateway admin identity enable ipad
                """
        )

        @ParentCommand var identityCommand: IdentityCommand
        @OptionGroup var identityOption: AdminIdentityOption

        @Argument(help: "The identity's name.")
        var name: String

        func run() async throws {
            try await changeState(
                name,
                ControllerRoutes.enableIdentity,
                identityOption.client(parent: identityCommand.admin)
            )
        }
    }

    struct Delete: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Delete an identity; its certificate stops being accepted.",
            discussion: """
                Example:
                  ils-gateway admin identity delete old-laptop
                """
        )

        @ParentCommand var identityCommand: IdentityCommand
        @OptionGroup var identityOption: AdminIdentityOption

        @Argument(help: "The identity's name.")
        var name: String

        func run() async throws {
            try IdentityName.validate(name)
            let client = try identityOption.client(parent: identityCommand.admin)
            _ = try await client.call(ControllerRoutes.deleteIdentity, name: name)
            say("deleted identity \(name)")
        }
    }

    struct Reissue: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Issue a fresh enrollment token; once it is used, the previous certificate stops working.",
            discussion: """
                Example:
                  ils-gateway admin identity reissue ipad -o ipad.jwt
                """
        )

        @ParentCommand var identityCommand: IdentityCommand
        @OptionGroup var identityOption: AdminIdentityOption

        @Argument(help: "The identity's name.")
        var name: String

        @OptionGroup var tokenOptions: TokenOptions

        func run() async throws {
            try IdentityName.validate(name)
            let prepared = try tokenOptions.prepare()
            defer { prepared.abandon() }
            let lifetime = prepared.lifetimeSeconds
            let client = try identityOption.client(parent: identityCommand.admin)
            let response = try await client.call(
                ControllerRoutes.reissueIdentity,
                name: name,
                body: ControllerAPI.ReissueRequest(tokenLifetimeSeconds: lifetime)
            )
            try emitToken(response, tokenOptions, into: prepared)
        }
    }
}

/// Revoke, disable or enable: one call, one line of output.
private func changeState(
    _ name: String,
    _ route: ControllerRoute<NoBody, IdentityRecord>,
    _ client: ControllerClient
) async throws {
    try IdentityName.validate(name)
    let identity = try await client.call(route, name: name)
    say("\(identity.name) is now \(identity.state.rawValue)")
}

/// `--expires` and `-o`, shared by the commands that issue a token.
struct TokenOptions: ParsableArguments {
    @Option(help: "How long the enrollment token stays valid, e.g. 30m, 24h, 7d.")
    var expires: String = "24h"

    @Option(name: .shortAndLong, help: "Write the token to this file (mode 0600) instead of printing it.")
    var output: String?

    @Flag(
        help: """
            Also print the token as a QR code (drawn for a dark terminal) and as the URI it carries, \
            ils-enroll://v1/<token>, for the app's camera or `ils-gateway enroll <uri>`.
            """
    )
    var qr = false

    @Option(
        name: .customLong("qr-png"),
        help: "Also write the QR code as a PNG image to this file (mode 0600: whoever holds it can enroll)."
    )
    var qrPNG: String?

    /// The token's lifetime, and its files (`-o`, `--qr-png`) reserved on disk: all before the controller is asked,
    /// because a token file or image that could not be written afterwards would leave an identity on the controller
    /// whose token nobody holds (a retry then gets 409). Anything at a path counts as taken, a dangling symbolic link
    /// too (`attributesOfItem` does not follow links); the reservation (`SecureFile.reserve`) proves the directory
    /// takes a new file and has room for it.
    func prepare() throws(ILSError) -> PreparedToken {
        let lifetime = try TimeSpan(parsing: expires).nanoseconds / 1_000_000_000
        guard lifetime > 0 else { throw ILSError(.invalidArgument, "--expires must be at least 1s") }
        if let output, let qrPNG, output == qrPNG {
            throw ILSError(.invalidArgument, "-o and --qr-png must name different files")
        }
        for path in [output, qrPNG].compactMap({ $0 })
        where (try? FileManager.default.attributesOfItem(atPath: path)) != nil {
            throw ILSError(
                .invalidArgument,
                "\(path) already exists (a symbolic link counts, even one to nothing); choose another file or remove "
                    + "it first. Nothing was created."
            )
        }
        var prepared = PreparedToken(lifetimeSeconds: lifetime)
        do throws(ILSError) {
            prepared.tokenFile = try output.map { path throws(ILSError) in
                try SecureFile.reserve(path, bytes: PreparedToken.reservedBytes)
            }
            prepared.qrImage = try qrPNG.map { path throws(ILSError) in
                try SecureFile.reserve(path, bytes: PreparedToken.reservedBytes)
            }
        } catch {
            prepared.abandon()
            throw ILSError(error.code, "\(error.reason). Nothing was created on the controller.")
        }
        return prepared
    }
}

/// What `TokenOptions.prepare` checked and reserved before the controller was asked for a token.
struct PreparedToken {
    /// Room taken for a token file or a QR image: a token is under 2 KiB, its QR code's PNG a few KiB.
    static let reservedBytes = 64 * 1024

    let lifetimeSeconds: Int64
    var tokenFile: SecureFile.Reservation?
    var qrImage: SecureFile.Reservation?

    init(lifetimeSeconds: Int64) {
        self.lifetimeSeconds = lifetimeSeconds
    }

    /// Removes the reserved files (the controller refused, or the call failed): nothing is left behind.
    func abandon() {
        tokenFile?.abandon()
        qrImage?.abandon()
    }
}

/// Prints the token on stdout (for pipes) or writes it to a 0600 file, and says what to do next on stderr.
private func emitToken(
    _ response: ControllerAPI.TokenResponse,
    _ options: TokenOptions,
    into prepared: PreparedToken
) throws(ILSError) {
    let identity = response.identity
    let output = options.output
    if options.qr || options.qrPNG != nil {
        let uri = EnrollmentURI.uri(for: response.token)
        if let path = options.qrPNG, let reservation = prepared.qrImage {
            let image = try QRMatrix.encode(uri, level: .medium).png()
            try reservation.commit(Data(image), overwrite: false)
            sayToStandardError(
                "QR code of the token written to \(path); it enrolls whoever scans it first, so delete it after"
            )
        }
        if options.qr {
            print(try QRMatrix.encode(uri, level: .low).terminalText(), terminator: "")
            say(uri)
        }
    }
    if let output, let reservation = prepared.tokenFile {
        try reservation.commit(Data((response.token + "\n").utf8), overwrite: false)
        sayToStandardError(
            "token for \(identity.name) (\(identity.role.rawValue)) written to \(output), valid until "
                + "\(formatTime(response.expiresAt)); enroll with: ils-gateway enroll \(output)"
        )
    } else {
        say(response.token)
        sayToStandardError(
            "token for \(identity.name) (\(identity.role.rawValue)) valid until \(formatTime(response.expiresAt)); "
                + "enroll with: ils-gateway enroll <token>"
        )
    }
}
