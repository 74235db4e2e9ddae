import Foundation
import Hummingbird
import ILSAdmin
import ILSCore

/// `/sessions`, `/services` and `/gateways`: what each controller of the cluster holds in memory (the circuits it
/// relays, the gateways linked to it), asked of every controller at once. A controller that does not answer is
/// named on the page, as `admin sessions` names it on stderr, so a partial list never passes for the whole.
extension ConsolePages {
    func registerSessions(on router: Router<ConsoleContext>) {
        router.get("/sessions") { request, context in await sessionsPage(request, context) }
        router.get("/gateways") { request, context in await gatewaysPage(request, context) }
    }

    func registerServices(on router: Router<ConsoleContext>) {
        router.get("/services") { request, context in
            await servicesPage(request, context, notice: sessions.takeNotice(for: context.session?.id))
        }
        router.post("/services") { request, context in await changeService(request, context, name: nil) }
        router.post("/services/:name") { request, context in
            await changeService(request, context, name: context.parameters.get("name") ?? "")
        }
        router.post("/services/:name/delete") { request, context in
            let name = context.parameters.get("name") ?? ""
            do throws(ILSError) {
                try await calls.deleteService(name)
                logger.notice("console: service deleted", metadata: ["service": "\(name)", "actor": "\(calls.actor)"])
                return changed("/services", notice: "\(name) was deleted.", context: context)
            } catch {
                return await servicesPage(request, context, status: Self.status(of: error), error: error.reason)
            }
        }
    }

    /// Every controller's answer, and one sentence per controller that gave none.
    private func gather<Value: Decodable & Sendable>(_ route: ControllerRoute<NoBody, Value>) async throws(ILSError)
        -> (answered: [(controller: ControllerAddress, value: Value)], partial: [String], controllers: Int)
    {
        let gathered = try await calls.everyController(route)
        let partial = gathered.failed.map { controller, error in
            "Controller \(controller) did not answer, so what it holds is not listed: \(error.reason)"
        }
        return (gathered.answered, partial, gathered.answered.count + gathered.failed.count)
    }

    private func sessionsPage(_ request: Request, _ context: ConsoleContext) async -> Response {
        var values: [String: Any] = [:]
        var error: String?
        do throws(ILSError) {
            let gathered = try await gather(ControllerRoutes.sessions)
            let listed = gathered.answered.flatMap { controller, sessions in sessions.map { ($0, controller) } }
            values["rows"] = listed.map { session, controller -> [String: Any] in
                [
                    "device": session.device, "service": session.service, "gateway": session.gateway,
                    "started": Self.time(session.startedAt), "fromDevice": session.bytesFromDevice,
                    "toDevice": session.bytesToDevice, "controller": session.controller ?? controller.description,
                ]
            }
            values["count"] = listed.count
            values["controllers"] = gathered.controllers
            values["partial"] = gathered.partial
        } catch let failure {
            error = failure.reason
        }
        return page("Sessions", "sessions", values, context: context, error: error, refresh: 5, request: request)
    }

    /// Every service once (`ClusterCalls.mergeServices`: the newest policies, every controller's hosts).
    private func services() async throws(ILSError) -> (services: [ControllerAPI.ServiceInfo], partial: [String]) {
        let gathered = try await gather(ControllerRoutes.services)
        return (ClusterCalls.mergeServices(gathered.answered.map(\.value)), gathered.partial)
    }

    func servicesPage(
        _ request: Request,
        _ context: ConsoleContext,
        status: HTTPResponse.Status = .ok,
        error: String? = nil,
        notice: String? = nil
    ) async -> Response {
        var values: [String: Any] = [:]
        var error = error
        do throws(ILSError) {
            let listed = try await services()
            values["partial"] = listed.partial
            values["rows"] = listed.services.map { service -> [String: Any] in
                let hosts = service.hosts
                let links = hosts.reduce(0) { $0 + $1.links }
                return [
                    "name": service.name, "dial": service.dial.description, "bind": service.bind.description,
                    "revision": service.revision,
                    "dialTokens": service.dial.tokens.joined(separator: ", "),
                    "bindTokens": service.bind.tokens.joined(separator: ", "),
                    "dialSemantics": Self.semantics(service.dial.semantic),
                    "bindSemantics": Self.semantics(service.bind.semantic),
                    "health": links > 0 ? "up: \(links) link(s)" : "down: no gateway hosts it",
                    "healthClass": links > 0 ? "ok" : "bad",
                    "hosts": hosts.isEmpty
                        ? "-" : Set(hosts.map(\.gateway)).sorted().joined(separator: ", "),
                ]
            }
        } catch let failure {
            error = error ?? failure.reason
        }
        return page(
            "Services",
            "services",
            values,
            context: context,
            status: status,
            error: error,
            notice: notice,
            request: request
        )
    }

    private static func semantics(_ selected: ServicePolicy.Semantic) -> [[String: Any]] {
        [ServicePolicy.Semantic.anyOf, .allOf].map { ["value": $0.rawValue, "selected": $0 == selected] }
    }

    /// Create (`name` nil) or update a service from its form. An update sends the revision the page showed, so a
    /// change someone made meanwhile is refused (409) rather than overwritten.
    private func changeService(_ request: Request, _ context: ConsoleContext, name: String?) async -> Response {
        let form = context.form
        func policy(_ prefix: String) throws(ILSError) -> ControllerAPI.PolicyText {
            guard let semantic = ServicePolicy.Semantic(rawValue: form["\(prefix)Semantic", default: "anyOf"]) else {
                throw ILSError(.invalidArgument, "the \(prefix) semantic must be anyOf or allOf")
            }
            let tokens = form[prefix, default: ""].split(separator: ",").map {
                $0.trimmingCharacters(in: .whitespaces)
            }.filter { !$0.isEmpty }
            return ControllerAPI.PolicyText(semantic: semantic, tokens: tokens)
        }
        do throws(ILSError) {
            if let name {
                guard let revision = form["revision"].flatMap({ Int64($0) }) else {
                    throw ILSError(.invalidArgument, "the form has no revision; reload the page")
                }
                try await calls.updateService(
                    name,
                    ControllerAPI.ServiceRequest(dial: try policy("dial"), bind: try policy("bind"), revision: revision)
                )
                logger.notice("console: service updated", metadata: ["service": "\(name)", "actor": "\(calls.actor)"])
                return changed("/services", notice: "\(name) was updated.", context: context)
            }
            let created = form["name", default: ""].trimmingCharacters(in: .whitespaces)
            try await calls.createService(
                ControllerAPI.ServiceRequest(name: created, dial: try policy("dial"), bind: try policy("bind"))
            )
            logger.notice("console: service created", metadata: ["service": "\(created)", "actor": "\(calls.actor)"])
            return changed("/services", notice: "\(created) was created.", context: context)
        } catch {
            let reason =
                error.code == .conflict && name != nil
                ? "The service changed meanwhile (\(error.reason)); its current policies are shown: make the change again."
                : error.reason
            return await servicesPage(request, context, status: Self.status(of: error), error: reason)
        }
    }

    /// Gateways are the identities with the gateway role, with what they host now, across every controller.
    private func gatewaysPage(_ request: Request, _ context: ConsoleContext) async -> Response {
        var values: [String: Any] = [:]
        var error: String?
        do throws(ILSError) {
            let identities = try await calls.identities().filter { $0.role == .gateway }
            let listed = try await services()
            values["partial"] = listed.partial
            values["rows"] = identities.map { gateway -> [String: Any] in
                var hosting: [String: Int] = [:]
                for service in listed.services {
                    for host in service.hosts where host.gateway == gateway.name {
                        hosting[service.name, default: 0] += host.links
                    }
                }
                let links = hosting.values.reduce(0, +)
                return [
                    "name": gateway.name, "state": gateway.state.rawValue,
                    "health": gateway.state != .active
                        ? "blocked" : links > 0 ? "connected: \(links) link(s)" : "not connected",
                    "healthClass": gateway.state == .active && links > 0 ? "ok" : "bad",
                    "hosting": hosting.isEmpty ? "-" : hosting.keys.sorted().joined(separator: ", "),
                    "lastSeen": Self.time(gateway.lastSeenAt),
                ]
            }
        } catch let failure {
            error = failure.reason
        }
        return page("Gateways", "gateways", values, context: context, error: error, refresh: 5, request: request)
    }
}
