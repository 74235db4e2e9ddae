import ArgumentParser
import Foundation
import ILSClient
import ILSCore

/// `ils-gateway admin`: talks to the controller's admin API as an admin identity, over mTLS.
struct AdminCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "admin",
        abstract: "Administer identities through the controller's admin API.",
        discussion: """
            --identity may be given before or after the verb. Default: identities/admin.json.

            Examples:
              ils-gateway admin identity create ipad --role device -o ipad.jwt
              ils-gateway admin --identity ops.json identity list --json
            """,
        subcommands: [IdentityCommand.self, SessionsCommand.self, AuditCommand.self]
    )

    @Option(help: "The admin identity file.")
    var identity: String?

    static let defaultIdentity = "identities/admin.json"
}

/// `--identity` after the verb, for the leaf commands.
struct AdminIdentityOption: ParsableArguments {
    @Option(name: .customLong("identity"), help: "The admin identity file (also accepted before the verb).")
    var identity: String?

    func client(parent: AdminCommand) throws(ILSError) -> ControllerClient {
        let path = identity ?? parent.identity ?? AdminCommand.defaultIdentity
        return try ControllerClient(identityFile: try IdentityFileIO.read(path))
    }
}

struct AuditCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "audit",
        abstract: "Show the audit log: admin actions, enrollments and refusals, with time and actor.",
        discussion: """
            Examples:
              ils-gateway admin audit --since 24h
              ils-gateway admin audit --json
            """
    )

    @ParentCommand var admin: AdminCommand
    @OptionGroup var identityOption: AdminIdentityOption

    @Option(help: "Only entries newer than this, e.g. 15m, 24h, 7d.")
    var since: String?

    @Flag(help: "Print JSON.")
    var json = false

    func run() async throws {
        let client = try identityOption.client(parent: admin)
        var from: Int64 = 0
        if let since {
            from = Int64(Date().timeIntervalSince1970) - (try TimeSpan(parsing: since)).nanoseconds / 1_000_000_000
        }
        let entries: [AuditEntryView] = try await client.call(.GET, "/v1/admin/audit?since=\(from)")
        if json {
            try printJSON(entries)
            return
        }
        for entry in entries {
            print("\(formatTime(entry.at))  \(entry.actor)  \(entry.action)  \(entry.target)  \(entry.detail)")
        }
    }
}

struct SessionsCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "sessions",
        abstract: "List live circuits: device, service, gateway, start time, bytes each way.",
        discussion: """
            Examples:
              ils-gateway admin sessions
              ils-gateway admin --identity identities/admin.json sessions --json
            """
    )

    @ParentCommand var admin: AdminCommand
    @OptionGroup var identityOption: AdminIdentityOption

    @Flag(help: "Print JSON.")
    var json = false

    func run() async throws {
        let client = try identityOption.client(parent: admin)
        let sessions: [ControllerAPI.Session] = try await client.call(.GET, "/v1/admin/sessions")
        if json {
            try printJSON(sessions)
            return
        }
        print("DEVICE          SERVICE         GATEWAY         STARTED               FROM-DEVICE  TO-DEVICE")
        for session in sessions {
            print(
                [session.device, session.service, session.gateway].map {
                    $0.padding(
                        toLength: 16,
                        withPad: " ",
                        startingAt: 0
                    )
                }.joined()
                    + formatTime(session.startedAt).padding(toLength: 22, withPad: " ", startingAt: 0)
                    + String(session.bytesFromDevice).padding(toLength: 13, withPad: " ", startingAt: 0)
                    + String(session.bytesToDevice)
            )
        }
    }
}

/// The audit entry as the API returns it.
struct AuditEntryView: Codable {
    var at: Int64
    var actor: String
    var action: String
    var target: String
    var detail: String
}

func printJSON<T: Encodable>(_ value: T) throws {
    let encoder = JSONEncoder()
    encoder.outputFormatting = [.prettyPrinted, .sortedKeys, .withoutEscapingSlashes]
    print(String(decoding: try encoder.encode(value), as: UTF8.self))
}

func formatTime(_ seconds: Int64?) -> String {
    guard let seconds else { return "-" }
    return Date(timeIntervalSince1970: TimeInterval(seconds)).formatted(.iso8601)
}
