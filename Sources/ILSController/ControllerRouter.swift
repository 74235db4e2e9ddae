import Foundation
import ILSCore
import ILSCrypto
import ILSFabric
import Logging
import NIOHTTP1

/// A request as the controller API sees it: method, path, query, a bounded body, and the caller's verified client
/// certificate (DER) when one was presented.
struct APIRequest {
    var method: HTTPMethod
    var path: String
    var query: [String: String]
    var body: [UInt8]
    var clientCertificate: [UInt8]?
    var peer: String
}

struct APIResponse {
    var status: HTTPResponseStatus
    var body: Data
    /// The cluster's controllers, for the `ils-controllers` header (`ControllerAddress.listHeader`).
    var controllers: [String]? = nil
}

/// Routes controller API requests to `Controller` and turns every outcome into JSON.
struct ControllerRouter: Sendable {
    let controller: Controller
    let live: LiveConnections
    let relay: Relay
    let logger: Logger

    private var enforcement: PolicyEnforcement {
        PolicyEnforcement(controller: controller, relay: relay, live: live, logger: logger)
    }

    func handle(_ request: APIRequest) async -> APIResponse {
        var response: APIResponse
        do throws(ILSError) {
            response = try await route(request)
        } catch {
            if error.code == .internalError {
                logger.error("request failed", metadata: ["path": "\(request.path)", "error": "\(error.detail ?? "")"])
            }
            response = Self.failure(error)
        }
        // A caller with an identity certificate (TLS verified it against the CA) learns the cluster on every answer,
        // so its identity file fails over to replicas that joined after it was written (docs/protocol.md).
        if request.clientCertificate != nil { response.controllers = controller.state.roster.announced }
        return response
    }

    /// Matches the request against the route table (`ControllerEndpoint`, the one declaration of every path).
    private func route(_ request: APIRequest) async throws(ILSError) -> APIResponse {
        guard let (endpoint, name) = ControllerEndpoint.match(method: request.method.rawValue, path: request.path)
        else {
            if request.path.split(separator: "/").starts(with: ControllerEndpoint.adminPrefix) {
                // As before the table: who may not use the admin API learns nothing of which paths it has.
                _ = try await controller.authenticateAdmin(certificateDER: request.clientCertificate)
                throw ILSError(.notFound, "no such admin endpoint: \(request.method) \(request.path.prefix(100))")
            }
            throw ILSError(.notFound, "no such API endpoint: \(request.method) \(request.path.prefix(100))")
        }
        switch endpoint {
        case .health:
            return try Self.json(["status": "ok"])
        case .enrollInfo:
            return try Self.json(controller.enrollInfo)
        case .enroll:
            let body = try Self.decode(ControllerAPI.EnrollRequest.self, request.body)
            do throws(ILSError) {
                let response = try await controller.enroll(body, now: Int64(Date().timeIntervalSince1970))
                // A re-enrollment (after reissue) replaces the certificate: connections made with the old one end.
                live.close(identityID: response.identity.id)
                ControllerMetrics.enrollments.increment()
                logger.info("enrolled", metadata: ["identity": "\(response.identity.name)", "peer": "\(request.peer)"])
                return try Self.json(response)
            } catch {
                let now = Int64(Date().timeIntervalSince1970)
                let first = controller.auditRefusedEnrollment(error, peer: request.peer, now: now)
                ControllerMetrics.refusal(error.code.name)
                // Like the audit rows: one notice per source and code a minute; the rest at debug, counted in metrics.
                logger.log(
                    level: first ? .notice : .debug,
                    "enrollment refused",
                    metadata: ["code": "\(error.code)", "peer": "\(request.peer)"]
                )
                throw error
            }
        case .renew:
            let body = try Self.decode(ControllerAPI.RenewRequest.self, request.body)
            let response = try await controller.renew(
                body,
                certificateDER: request.clientCertificate,
                now: Int64(Date().timeIntervalSince1970)
            )
            logger.info("renewed", metadata: ["identity": "\(response.identity.name)"])
            return try Self.json(response)
        case .controllers:
            // Any active identity may ask which controllers share this one's store (devices and gateways fail over
            // along it; `status` shows it).
            guard let certificate = request.clientCertificate else {
                throw ILSError(.permissionDenied, "no client certificate was presented")
            }
            let presented = try IdentityCertificate(der: certificate)
            _ = try await controller.authenticateLearning(
                certificateDER: certificate,
                role: presented.role,
                purpose: "the list"
            )
            return try Self.json(try await controller.controllers())
        case .whoami:
            // Any enrolled, active identity may ask how the controller sees it (ils-gateway status).
            guard let certificate = request.clientCertificate else {
                throw ILSError(.permissionDenied, "no client certificate was presented")
            }
            let presented = try IdentityCertificate(der: certificate)
            return try Self.json(
                try await controller.authenticateLearning(
                    certificateDER: certificate,
                    role: presented.role,
                    purpose: "status"
                )
            )
        case .identities, .createIdentity, .identity, .deleteIdentity, .identityAttributes, .revokeIdentity,
            .disableIdentity, .enableIdentity, .reissueIdentity, .services, .service, .createService, .updateService,
            .deleteService, .sessions, .audit, .clusterJoin:
            let admin = try await controller.authenticateAdmin(certificateDER: request.clientCertificate)
            let outcome: Result<APIResponse, ILSError>
            do throws(ILSError) {
                outcome = .success(try await routeAdmin(request, endpoint, name: name ?? "", actor: admin.name))
            } catch {
                outcome = .failure(error)
            }
            // A change is answered once what it pushed to the gateways linked here (a narrowed grant, a block list)
            // is written to their connections, not only queued on an event loop: a request the admin sends next
            // cannot get to a gateway before it (docs/design/cluster.md "A narrowing fails closed").
            if request.method != .GET { await live.delivered() }
            return try outcome.get()
        }
    }

    private func routeAdmin(
        _ request: APIRequest,
        _ endpoint: ControllerEndpoint,
        name: String,
        actor: String
    ) async throws(ILSError) -> APIResponse {
        // A service's name is checked before it is looked up or repeated in an answer.
        if [.service, .updateService, .deleteService].contains(endpoint) { try IdentityName.validate(name) }
        switch endpoint {
        case .identities:
            return try Self.json(try await controller.state.store.identities())
        case .createIdentity:
            let body = try Self.decode(ControllerAPI.CreateIdentityRequest.self, request.body)
            let created = try await controller.createIdentity(body, actor: actor)
            // A policy may match the new identity: gateways learn the grants that now hold it.
            enforcement.enforce()
            return try Self.json(created, status: .created)
        case .identity:
            return try Self.json(try await controller.identity(named: name))
        case .deleteIdentity:
            let doomed = try await controller.deleteIdentity(named: name, actor: actor)
            // Like a revocation: its connections end now (the relay also re-checks every circuit against the store).
            await live.close(identityID: doomed.id, blocked: "identity '\(doomed.name)' was deleted")
            enforcement.enforce()
            return try Self.json(["deleted": name])
        case .identityAttributes:
            let body = try Self.decode(ControllerAPI.AttributesRequest.self, request.body)
            let record = try await controller.updateAttributes(named: name, attributes: body.attributes, actor: actor)
            // Before answering, like a revocation: circuits the new attributes no longer allow end here and at every
            // gateway linked here.
            enforcement.enforce()
            logger.notice("identity attributes changed", metadata: ["identity": "\(name)", "actor": "\(actor)"])
            return try Self.json(record)
        case .services:
            let hosting = relay.hosting()
            let services = try await controller.state.store.services()
            return try Self.json(services.map { controller.serviceInfo($0, hosts: hosting[$0.name] ?? []) })
        case .service:
            guard let service = try await controller.state.store.service(named: name) else {
                throw ILSError(.notFound, "no service named '\(name)'")
            }
            return try Self.json(controller.serviceInfo(service, hosts: relay.hosting()[name] ?? [], dialers: true))
        case .createService:
            let body = try Self.decode(ControllerAPI.ServiceRequest.self, request.body)
            let service = try await controller.createService(body, actor: actor)
            enforcement.enforce(service)
            logger.notice("service created", metadata: ["service": "\(service.name)", "actor": "\(actor)"])
            return try Self.json(controller.serviceInfo(service, hosts: []), status: .created)
        case .updateService:
            let body = try Self.decode(ControllerAPI.ServiceRequest.self, request.body)
            let service = try await controller.updateService(named: name, body, actor: actor)
            // Before answering: a device the new policy leaves out loses its live circuits to the service now.
            enforcement.enforce(service)
            logger.notice(
                "service updated",
                metadata: ["service": "\(name)", "revision": "\(service.revision)", "actor": "\(actor)"]
            )
            return try Self.json(controller.serviceInfo(service, hosts: relay.hosting()[name] ?? []))
        case .deleteService:
            _ = try await controller.deleteService(named: name, actor: actor)
            enforcement.enforce(removed: [name])
            return try Self.json(["deleted": name])
        case .revokeIdentity, .disableIdentity, .enableIdentity:
            let target: IdentityState =
                endpoint == .revokeIdentity ? .revoked : endpoint == .disableIdentity ? .disabled : .active
            let change = try await controller.changeState(name: name, to: target, actor: actor)
            let record = change.record
            // Before answering: end the identity's live connections (and so its circuits) here, and tell every
            // gateway, which ends its circuits too and refuses new ones. This happens whether or not the store
            // could save the change: a full disk must not keep a lost device streaming.
            if target != .active {
                await live.close(identityID: record.id, blocked: "identity '\(record.name)' is \(target.rawValue)")
            }
            if target == .revoked { ControllerMetrics.revocations.increment() }
            live.push(HostControlMessage(blocked: controller.blockedIdentityIDs()))
            guard case .unsaved(_, let storeError) = change else {
                logger.notice("identity \(target.rawValue)", metadata: ["identity": "\(name)", "actor": "\(actor)"])
                return try Self.json(record)
            }
            logger.error(
                "identity \(target.rawValue) in memory only: the store could not save it",
                metadata: [
                    "identity": "\(name)", "actor": "\(actor)", "error": "\(storeError.detail ?? storeError.reason)",
                ]
            )
            throw ILSError(
                .unavailable,
                "'\(name)' is \(target.rawValue) now: its connections were closed and every gateway was told to block "
                    + "it, but the store could not save the change (is its disk full?); this controller retries and "
                    + "keeps the block until it restarts: run the command again once the store can be written"
            )
        case .sessions:
            return try Self.json(relay.sessions())
        case .reissueIdentity:
            let body = try Self.decode(ControllerAPI.ReissueRequest.self, request.body)
            return try Self.json(
                try await controller.reissue(name: name, lifetime: body.tokenLifetimeSeconds, actor: actor)
            )
        case .audit:
            return try Self.json(try await auditPage(request.query))
        case .clusterJoin:
            let body = try Self.decode(ControllerAPI.JoinRequest.self, request.body)
            let response = try await controller.join(body, actor: actor)
            logger.notice(
                "controller replica joined",
                metadata: ["address": "\(body.address.prefix(200))", "actor": "\(actor)"]
            )
            return try Self.json(response)
        case .health, .enrollInfo, .enroll, .renew, .controllers, .whoami:
            // `route` answers these itself; were one sent here, it is no admin endpoint.
            throw ILSError(.notFound, "no such admin endpoint: \(request.method) \(request.path.prefix(100))")
        }
    }

    /// `GET /v1/admin/audit?since=UNIX&before=SEQ&limit=N&actor=&action=&target=` (`ControllerAPI.AuditPage`).
    /// Refusal counts not yet written go in first, so the page shows every refusal up to now.
    private func auditPage(_ query: [String: String]) async throws(ILSError) -> ControllerAPI.AuditPage {
        func number(_ name: String) throws(ILSError) -> Int64? {
            guard let text = query[name] else { return nil }
            guard let value = Int64(text), value >= 0 else {
                throw ILSError(.invalidArgument, "'\(name)' must be a whole number, not '\(text.prefix(40))'")
            }
            return value
        }
        let maximum = ControllerAPI.AuditPage.maximumLimit
        let limit = Int(min(try number("limit") ?? Int64(maximum), Int64(maximum)))
        guard limit > 0 else { throw ILSError(.invalidArgument, "'limit' must be at least 1") }
        let filter = try ControllerAPI.AuditFilter(query: query)
        await controller.flushRefusals()
        let entries = try await controller.state.store.auditEntries(
            since: try number("since") ?? 0,
            before: try number("before"),
            limit: limit,
            filter: filter
        )
        return ControllerAPI.AuditPage(entries: entries, nextBefore: entries.count == limit ? entries.first?.seq : nil)
    }

    static func decode<T: Decodable>(_ type: T.Type, _ body: [UInt8]) throws(ILSError) -> T {
        do {
            return try JSONDecoder().decode(type, from: Data(body))
        } catch {
            throw ILSError(.invalidArgument, "the request body is not the expected JSON")
        }
    }

    static func json<T: Encodable>(_ value: T, status: HTTPResponseStatus = .ok) throws(ILSError) -> APIResponse {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        do {
            return APIResponse(status: status, body: try encoder.encode(value))
        } catch {
            throw ILSError(.internalError, "could not encode the response")
        }
    }

    /// Maps an error to its HTTP status; the body carries the stable code and the safe sentence, never `detail`.
    static func failure(_ error: ILSError) -> APIResponse {
        let status: HTTPResponseStatus
        switch error.code.name {
        case EnrollmentRefusal.used.rawValue: status = .conflict
        case EnrollmentRefusal.expired.rawValue: status = .gone
        case EnrollmentRefusal.unknown.rawValue: status = .notFound
        case EnrollmentRefusal.malformedToken.rawValue, EnrollmentRefusal.unsupportedAlgorithm.rawValue:
            status = .badRequest
        case _ where error.code.name.hasPrefix("token_") || error.code.name.hasPrefix("enroll_"): status = .forbidden
        case ILSError.Code.invalidArgument.name, ILSError.Code.invalidInput.name: status = .badRequest
        case ILSError.Code.notFound.name: status = .notFound
        case ILSError.Code.permissionDenied.name: status = .forbidden
        case ILSError.Code.conflict.name: status = .conflict
        case ILSError.Code.unavailable.name: status = .serviceUnavailable
        default: status = .internalServerError
        }
        let body = ControllerAPI.ErrorBody(error: error.reason, code: error.code.name)
        let data = (try? JSONEncoder().encode(body)) ?? Data()
        return APIResponse(status: status, body: data)
    }
}
