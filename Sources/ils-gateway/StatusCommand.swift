import ArgumentParser
import Foundation
import ILSClient
import ILSCore
import ILSCrypto

/// `ils-gateway status`: who this identity is, and whether the controller accepts it right now.
struct StatusCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "status",
        abstract: "Show this identity, its certificate expiry, and whether the controller is reachable and accepts it.",
        discussion: """
            Exit status 0 when the controller accepts the identity; 69 when it cannot be reached; 77 when it refuses
            the identity (revoked, disabled, deleted, replaced or expired certificate).

            Example:
              ils-gateway status --identity identities/ipad.json
            """
    )

    @Option(help: "The identity file. Env: ILS_IDENTITY. Default: identities/admin.json.")
    var identity: String?

    @Flag(help: "Print JSON.")
    var json = false

    struct Report: Codable {
        var name: String
        var id: String
        var role: IdentityRole
        var controller: String
        var certificateExpiresAt: String
        var controllerReachable: Bool
        var accepted: Bool
        var state: IdentityState?
        var problem: String?
    }

    func run() async throws {
        let path = identity ?? ProcessEnvironment()["ILS_IDENTITY"] ?? "identities/admin.json"
        let file = try IdentityFileIO.read(path)
        let certificate = try IdentityCertificate(pem: file.certificate)
        var report = Report(
            name: file.identity.name,
            id: file.identity.id,
            role: file.identity.role,
            controller: file.controller,
            certificateExpiresAt: certificate.notAfter.formatted(.iso8601),
            controllerReachable: false,
            accepted: false,
            state: nil,
            problem: nil
        )
        var failure: ILSError?
        do {
            let client = try ControllerClient(identityFile: file)
            let record: IdentityRecord = try await client.call(.GET, "/v1/whoami")
            report.controllerReachable = true
            report.accepted = true
            report.state = record.state
        } catch {
            report.controllerReachable = error.code != .unavailable
            report.problem = error.reason
            failure = error
        }
        if json {
            try printJSON(report)
        } else {
            say("identity:    \(report.name) (\(report.role.rawValue)), id \(report.id)")
            say("certificate: expires \(report.certificateExpiresAt)")
            say("controller:  \(report.controller) — \(report.controllerReachable ? "reachable" : "unreachable")")
            say("accepted:    \(report.accepted ? "yes, state \(report.state?.rawValue ?? "?")" : "no")")
            if let problem = report.problem { say("problem:     \(problem)") }
        }
        if let failure { throw ExitCode(failure.code.exitCode) }
    }
}
