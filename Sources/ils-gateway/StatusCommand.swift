import ArgumentParser
import Foundation
import ILSAdmin
import ILSCore
import ILSCrypto
import ILSIdentity

/// `ils-gateway status`: who this identity is, and whether the controller accepts it right now.
struct StatusCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "status",
        abstract: "Show this identity, its certificate expiry, and whether the controller is reachable and accepts it.",
        discussion: """
            Exit status 0 when the controller accepts the identity; 69 when it cannot be reached; 77 when it refuses
            the identity (revoked, disabled, deleted, replaced or expired certificate). When the identity file's
            controller is down, the next one it lists is asked.

            Once accepted, every controller of the cluster is asked too (GET /v1/controllers, then each one's
            /v1/whoami): reachable or not, and for an admin identity how many live sessions each one relays.

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
        /// Every controller of the cluster, once the identity is accepted.
        var controllers: [ControllerStatus]?
    }

    struct ControllerStatus: Codable {
        var address: String
        var reachable: Bool
        var accepted: Bool
        /// Live sessions it relays (admin identities only).
        var sessions: Int?
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
            // Read-only: `status` never rewrites the file (it may be run with sudo on a service's file).
            let client = try ControllerClient(identityFile: file)
            let record = try await client.call(ControllerRoutes.whoami)
            report.controllerReachable = true
            report.accepted = true
            report.state = record.state
            report.controllers = await Self.cluster(client, admin: record.role == .admin)
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
            if let controllers = report.controllers, !controllers.isEmpty { say("cluster:") }
            for controller in report.controllers ?? [] {
                var line = "  " + cell(controller.address, 32)
                if !controller.reachable {
                    line += "unreachable"
                } else {
                    line += controller.accepted ? "accepts this identity" : "refuses this identity"
                }
                if let sessions = controller.sessions { line += ", \(sessions) live sessions" }
                if let problem = controller.problem { line += ": \(problem)" }
                say(line)
            }
        }
        if let failure { throw ExitCode(failure.code.exitCode) }
    }

    /// Each controller's view of this identity (and, for an admin, its session count). A cluster list that cannot
    /// be read leaves the report without it: the identity's own check above already answered.
    static func cluster(_ client: ControllerClient, admin: Bool) async -> [ControllerStatus]? {
        guard let controllers = try? await ClusterCalls.controllers(client) else { return nil }
        let whoami = await ClusterCalls.ask(client, ControllerRoutes.whoami, at: controllers)
        let sessions =
            admin
            ? await ClusterCalls.ask(client, ControllerRoutes.sessions, at: controllers)
            : []
        return whoami.enumerated().map { index, answer in
            var status = ControllerStatus(
                address: answer.controller.description,
                reachable: true,
                accepted: true,
                sessions: nil,
                problem: nil
            )
            if case .failure(let error) = answer.result {
                status.reachable = error.code != .unavailable
                status.accepted = false
                status.problem = error.reason
            }
            if index < sessions.count, case .success(let listed) = sessions[index].result {
                status.sessions = listed.count
            }
            return status
        }
    }
}
