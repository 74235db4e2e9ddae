import ArgumentParser
import Foundation
import ILSAdmin
import ILSCore
import ILSIdentity

/// `ils-gateway admin`: talks to the controller's admin API as an admin identity, over mTLS.
struct AdminCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "admin",
        abstract: "Administer identities and services through the controller's admin API.",
        discussion: """
            --identity may be given before or after the verb. Default: identities/admin.json.

            Examples:
              ils-gateway admin identity create ipad --role device -o ipad.jwt
              ils-gateway admin --identity ops.json identity list --json
            """,
        subcommands: [
            IdentityCommand.self, ServiceCommand.self, SessionsCommand.self, AuditCommand.self, ConsoleCommand.self,
        ]
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
        return try ControllerClient(path: path)
    }
}

struct AuditCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "audit",
        abstract: "Show the audit log: admin actions, enrollments and refusals, with time and actor.",
        discussion: """
            Shows the newest --limit entries (default 100), oldest first. When older entries remain, the command
            for the next page is printed on stderr (--before SEQ, the first entry's sequence number). Refused
            enrollments are counted per source address and code: the first of a minute is one entry, the rest of
            that minute one more entry whose detail ends in count=N.

            Examples:
              ils-gateway admin audit --since 24h
              ils-gateway admin audit --since 1h --limit 100
              ils-gateway admin audit --json --before 5120
              ils-gateway admin audit --action identity.revoke --target ipad
              ils-gateway admin audit --action identity. --actor admin
            """
    )

    @ParentCommand var admin: AdminCommand
    @OptionGroup var identityOption: AdminIdentityOption

    @Option(help: "Only entries newer than this, e.g. 15m, 24h, 7d.")
    var since: String?

    @Option(help: "Only entries older than this sequence number (the next page). Default: the newest.")
    var before: Int64?

    @Option(help: "At most this many entries, 1-1000. Default: 100.")
    var limit: Int = 100

    @Option(help: "Only entries by this actor (an identity name, or 'controller').")
    var actor: String?

    @Option(
        help: "Only entries with this action, e.g. identity.revoke; one ending in '.' matches every action it starts."
    )
    var action: String?

    @Option(help: "Only entries about this target (an identity, service or address).")
    var target: String?

    @Flag(help: "Print JSON: an array of entries, each with seq, at, actor, action, target and detail.")
    var json = false

    func run() async throws {
        guard (1...ControllerAPI.AuditPage.maximumLimit).contains(limit) else {
            throw ILSError(.invalidArgument, "--limit must be between 1 and \(ControllerAPI.AuditPage.maximumLimit)")
        }
        let client = try identityOption.client(parent: admin)
        var from: Int64 = 0
        if let since {
            from = Int64(Date().timeIntervalSince1970) - (try TimeSpan(parsing: since)).nanoseconds / 1_000_000_000
        }
        var query = [("since", "\(max(from, 0))"), ("limit", "\(limit)")]
        if let before { query.append(("before", "\(before)")) }
        // Checked here too, so a bad filter is refused before the controller is asked.
        var filter: [String: String] = [:]
        for (name, value) in [("actor", actor), ("action", action), ("target", target)] { filter[name] = value }
        query += try ControllerAPI.AuditFilter(query: filter).queryItems
        let page = try await client.call(ControllerRoutes.audit, query: query)
        if json {
            try printJSON(page.entries)
        } else {
            for entry in page.entries {
                say("\(formatTime(entry.at))  \(entry.actor)  \(entry.action)  \(entry.target)  \(entry.detail)")
            }
        }
        if let next = page.nextBefore {
            var flags = since.map { " --since \($0)" } ?? ""
            for (name, value) in [("actor", actor), ("action", action), ("target", target)] {
                if let value { flags += " --\(name) \(value)" }
            }
            sayToStandardError("older entries: ils-gateway admin audit\(flags) --limit \(limit) --before \(next)")
        }
    }
}

struct SessionsCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "sessions",
        abstract: "List live circuits on every controller: device, service, gateway, controller, start, bytes.",
        discussion: """
            Each controller relays its own circuits and knows only those, so the command asks every controller of
            the cluster (GET /v1/controllers, then GET /v1/admin/sessions on each) with the same admin identity.
            A controller that does not answer is named on stderr; the others' sessions are still printed, and the
            exit status is then 69 (unavailable), so a script never takes a partial list for the whole.

            Examples:
              ils-gateway admin sessions
              ils-gateway admin --identity identities/admin.json sessions --json
            """
    )

    @ParentCommand var admin: AdminCommand
    @OptionGroup var identityOption: AdminIdentityOption

    @Flag(help: "Print JSON: every session, each with the controller that relays it.")
    var json = false

    func run() async throws {
        let client = try identityOption.client(parent: admin)
        let gathered = try await ClusterCalls.gather(client, ControllerRoutes.sessions)
        for (controller, error) in gathered.failed {
            sayToStandardError("controller \(controller) did not answer, its sessions are not listed: \(error.reason)")
        }
        let sessions = gathered.answered.flatMap { controller, listed in
            listed.map { session in
                var session = session
                session.controller = session.controller ?? controller.description
                return session
            }
        }
        if json {
            try printJSON(sessions)
        } else {
            say(
                "DEVICE          SERVICE         GATEWAY         STARTED               FROM-DEVICE  TO-DEVICE    "
                    + "CONTROLLER"
            )
            for session in sessions {
                say(
                    cell(session.device, 16) + cell(session.service, 16) + cell(session.gateway, 16)
                        + cell(formatTime(session.startedAt), 22) + cell(String(session.bytesFromDevice), 13)
                        + cell(String(session.bytesToDevice), 13) + (session.controller ?? "-")
                )
            }
        }
        if let first = gathered.failed.first { throw ExitCode(first.error.code.exitCode) }
    }
}

/// Prints `value` as JSON. The encoder escapes C0 itself but writes DEL, C1 (U+009B is an 8-bit CSI to some
/// terminals), the line separators and the bidi controls raw; those can only occur inside strings, so they are
/// written as `\uXXXX` escapes here: the same JSON value, nothing a terminal obeys.
func printJSON<T: Encodable>(_ value: T) throws {
    let encoder = JSONEncoder()
    encoder.outputFormatting = [.prettyPrinted, .sortedKeys, .withoutEscapingSlashes]
    let text = String(decoding: try encoder.encode(value), as: UTF8.self)
    var safe = String.UnicodeScalarView()
    for scalar in text.unicodeScalars {
        if scalar.value >= 0x7F, ControlCharacters.isControl(scalar) {
            let digits = String(scalar.value, radix: 16)
            safe.append(contentsOf: ("\\u" + String(repeating: "0", count: 4 - digits.count) + digits).unicodeScalars)
        } else {
            safe.append(scalar)
        }
    }
    print(String(safe))
}

func formatTime(_ seconds: Int64?) -> String {
    guard let seconds else { return "-" }
    return Date(timeIntervalSince1970: TimeInterval(seconds)).formatted(.iso8601)
}
