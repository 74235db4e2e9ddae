public import ArgumentParser
import Foundation
import ILSAdmin
public import ILSCore
import ILSIdentity

extension ServicePolicy.Semantic: ExpressibleByArgument {}

/// `ils-gateway admin service ...`
struct ServiceCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "service",
        abstract: "Create, list, show, update and delete services and who may dial and host them.",
        discussion: """
            A service is what a gateway hosts and a device dials (claude-api is made at controller init). Each has
            a dial policy (who may open circuits to it) and a bind policy (which gateways may host it). A policy is
            a comma-separated list of tokens:
              role:device, role:gateway, role:admin   identities of that role
              #ATTRIBUTE                              identities carrying the attribute (identity create --attributes)
              @NAME                                   that one identity (a later identity of the same name is not it)
              #all                                    everyone (alone)
            anyOf (the default) allows an identity matching any token; allOf one matching every token. An empty
            list allows nobody.

            A change applies before the command returns: a device the new dial policy leaves out loses its live
            circuits to the service, on every controller, and gateways refuse its new ones; a gateway the new bind
            policy leaves out is disconnected.

            Examples:
              ils-gateway admin service create second-api --dial 'role:device' --bind '@gw-second'
              ils-gateway admin service update claude-api --dial '#ipad'
              ils-gateway admin service update claude-api --dial 'role:device,#ipad' --dial-semantic allOf
              ils-gateway admin service list
            """,
        subcommands: [Create.self, List.self, Show.self, Update.self, Delete.self]
    )

    @ParentCommand var admin: AdminCommand

    /// `--dial`, `--bind` and their semantics.
    struct PolicyOptions: ParsableArguments {
        @Option(help: "Who may dial: comma-separated tokens, e.g. 'role:device,#ipad' ('' allows nobody).")
        var dial: String?

        @Option(help: "anyOf (a dialer matches one token) or allOf (every token).")
        var dialSemantic: ServicePolicy.Semantic?

        @Option(help: "Which gateways may host: comma-separated tokens, e.g. 'role:gateway' or '@gw-home'.")
        var bind: String?

        @Option(help: "anyOf or allOf, for --bind.")
        var bindSemantic: ServicePolicy.Semantic?

        static func tokens(_ text: String) -> [String] {
            text.split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces) }.filter { !$0.isEmpty }
        }

        /// The policy to send for `text` and `semantic`; `current` fills what is not given (an update).
        static func policy(
            _ text: String?,
            _ semantic: ServicePolicy.Semantic?,
            current: ControllerAPI.PolicyText?
        ) -> ControllerAPI.PolicyText? {
            guard text != nil || semantic != nil else { return nil }
            return ControllerAPI.PolicyText(
                semantic: semantic ?? current?.semantic ?? .anyOf,
                tokens: text.map(tokens) ?? current?.tokens ?? []
            )
        }
    }

    struct Create: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Create a service (default policies: devices dial, gateways host).",
            discussion: """
                Example:
                  ils-gateway admin service create second-api --bind '@gw-second'
                  ils-gateway serve --identity identities/gw-second.json --service second-api --backend http://127.0.0.1:9000
                """
        )

        @ParentCommand var serviceCommand: ServiceCommand
        @OptionGroup var identityOption: AdminIdentityOption

        @Argument(help: "The service's name: 1-64 letters, digits, '.', '_' or '-'.")
        var name: String

        @OptionGroup var policies: PolicyOptions

        func run() async throws {
            try IdentityName.validate(name)
            let client = try identityOption.client(parent: serviceCommand.admin)
            let info = try await client.call(
                ControllerRoutes.createService,
                body: ControllerAPI.ServiceRequest(
                    name: name,
                    dial: PolicyOptions.policy(policies.dial, policies.dialSemantic, current: nil),
                    bind: PolicyOptions.policy(policies.bind, policies.bindSemantic, current: nil)
                )
            )
            say("created \(info.name): dial \(info.dial.description), bind \(info.bind.description)")
        }
    }

    struct List: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "List services with their policies and the gateways hosting them on every controller.",
            discussion: """
                Each controller knows the gateways linked to it, so every controller of the cluster is asked; one
                that does not answer is named on stderr and the exit status is 69.

                Example:
                  ils-gateway admin service list --json
                """
        )

        @ParentCommand var serviceCommand: ServiceCommand
        @OptionGroup var identityOption: AdminIdentityOption

        @Flag(help: "Print JSON.")
        var json = false

        func run() async throws {
            let client = try identityOption.client(parent: serviceCommand.admin)
            let (services, partial) = try await Self.everywhere(client, ControllerRoutes.services)
            let merged = ClusterCalls.mergeServices(services)
            if json {
                try printJSON(merged)
            } else {
                say(cell("NAME", 20) + cell("DIAL", 34) + cell("BIND", 28) + "GATEWAYS")
                for service in merged {
                    let hosts = Set(service.hosts.map(\.gateway)).sorted()
                    say(
                        cell(service.name, 20) + cell(service.dial.description, 34) + cell(service.bind.description, 28)
                            + (hosts.isEmpty ? "none (down)" : hosts.joined(separator: ","))
                    )
                }
            }
            if partial { throw ExitCode(ILSError.Code.unavailable.exitCode) }
        }

        /// Asks every controller; returns the answers and whether one did not answer (named on stderr).
        static func everywhere<Value: Decodable & Sendable>(
            _ client: ControllerClient,
            _ route: ControllerRoute<NoBody, Value>,
            name: String? = nil
        ) async throws -> ([Value], partial: Bool) {
            let gathered = try await ClusterCalls.gather(client, route, name: name)
            for (controller, error) in gathered.failed {
                sayToStandardError("controller \(controller) did not answer: \(error.reason)")
            }
            return (gathered.answered.map(\.value), !gathered.failed.isEmpty)
        }
    }

    struct Show: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Show a service: policies, revision, who may dial it now, and its gateways on every controller.",
            discussion: """
                Example:
                  ils-gateway admin service show claude-api
                """
        )

        @ParentCommand var serviceCommand: ServiceCommand
        @OptionGroup var identityOption: AdminIdentityOption

        @Argument(help: "The service's name.")
        var name: String

        @Flag(help: "Print JSON.")
        var json = false

        func run() async throws {
            try IdentityName.validate(name)
            let client = try identityOption.client(parent: serviceCommand.admin)
            let (answers, partial) = try await List.everywhere(client, ControllerRoutes.service, name: name)
            guard var info = answers.first else { throw ILSError(.notFound, "no service named '\(name)'") }
            info.hosts = answers.flatMap(\.hosts)
            if json {
                try printJSON(info)
            } else {
                say("name:      \(info.name)")
                say("revision:  \(info.revision)")
                say("dial:      \(info.dial.description)")
                say("bind:      \(info.bind.description)")
                let dialers = (info.dialers ?? []).joined(separator: ",")
                say("may dial:  \(dialers.isEmpty ? "nobody" : dialers)\(info.dialersTruncated == true ? ",…" : "")")
                if info.hosts.isEmpty { say("gateways:  none (the service is down)") }
                for host in info.hosts {
                    say("gateway:   \(host.gateway) (\(host.links) links to \(host.controller))")
                }
            }
            if partial { throw ExitCode(ILSError.Code.unavailable.exitCode) }
        }
    }

    struct Update: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Change a service's policies; live circuits they no longer allow end before this returns.",
            discussion: """
                What is not given stays. The change is made against the revision just read: if another admin
                changed the service meanwhile, it is refused (exit 79) and nothing is written; run it again.

                Examples:
                  ils-gateway admin service update claude-api --dial '#ipad'
                  ils-gateway admin service update claude-api --bind '@gw-home,@gw-office'
                """
        )

        @ParentCommand var serviceCommand: ServiceCommand
        @OptionGroup var identityOption: AdminIdentityOption

        @Argument(help: "The service's name.")
        var name: String

        @OptionGroup var policies: PolicyOptions

        func run() async throws {
            try IdentityName.validate(name)
            guard
                policies.dial != nil || policies.dialSemantic != nil || policies.bind != nil
                    || policies.bindSemantic != nil
            else { throw ValidationError("give --dial, --bind or their semantics: there is nothing to change") }
            let client = try identityOption.client(parent: serviceCommand.admin)
            let current = try await client.call(ControllerRoutes.service, name: name)
            let info = try await client.call(
                ControllerRoutes.updateService,
                name: name,
                body: ControllerAPI.ServiceRequest(
                    dial: PolicyOptions.policy(policies.dial, policies.dialSemantic, current: current.dial),
                    bind: PolicyOptions.policy(policies.bind, policies.bindSemantic, current: current.bind),
                    revision: current.revision
                )
            )
            say(
                "updated \(info.name) (revision \(info.revision)): dial \(info.dial.description), bind \(info.bind.description)"
            )
        }
    }

    struct Delete: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Delete a service: its circuits end and its gateways are disconnected now.",
            discussion: """
                Example:
                  ils-gateway admin service delete second-api
                """
        )

        @ParentCommand var serviceCommand: ServiceCommand
        @OptionGroup var identityOption: AdminIdentityOption

        @Argument(help: "The service's name.")
        var name: String

        func run() async throws {
            try IdentityName.validate(name)
            let client = try identityOption.client(parent: serviceCommand.admin)
            _ = try await client.call(ControllerRoutes.deleteService, name: name)
            say("deleted \(name)")
        }
    }
}
