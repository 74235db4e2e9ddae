import Foundation
import Hummingbird
import ILSCore
import ILSQRCode

/// `/identities`: the list, the create form (which answers with the enrollment QR code), and revoke, disable,
/// enable, delete and reissue. A revocation goes through the same API call as `admin identity revoke`, so the
/// controller ends the device's live circuits before the page is answered.
extension ConsolePages {
    func registerIdentities(on router: Router<ConsoleContext>) {
        router.get("/identities") { request, context in
            await identitiesPage(request, context, notice: sessions.takeNotice(for: context.session?.id))
        }
        router.post("/identities") { request, context in await createIdentity(request, context) }
        router.post("/identities/:name/:verb") { request, context in await changeIdentity(request, context) }
    }

    func identitiesPage(
        _ request: Request,
        _ context: ConsoleContext,
        status: HTTPResponse.Status = .ok,
        error: String? = nil,
        notice: String? = nil
    ) async -> Response {
        var values: [String: Any] = [:]
        var error = error
        do {
            let identities = try await calls.identities()
            values["rows"] = identities.map { identity -> [String: Any] in
                [
                    "name": identity.name, "role": identity.role.rawValue,
                    "attributes": identity.attributes.joined(separator: ", "), "state": identity.state.rawValue,
                    "stateClass": identity.state == .active ? "ok" : "bad",
                    "lastSeen": Self.time(identity.lastSeenAt),
                    "canRevoke": identity.state != .revoked, "canDisable": identity.state == .active,
                    "canEnable": identity.state == .disabled,
                ]
            }
        } catch let failure {
            error = error ?? "The controller did not list identities: \(failure.reason)"
        }
        return page(
            "Identities",
            "identities",
            values,
            context: context,
            status: status,
            error: error,
            notice: notice,
            request: request
        )
    }

    private func createIdentity(_ request: Request, _ context: ConsoleContext) async -> Response {
        let form = context.form
        let name = form["name", default: ""].trimmingCharacters(in: .whitespaces)
        do throws(ILSError) {
            try IdentityName.validate(name)
            guard let role = IdentityRole(rawValue: form["role", default: ""]) else {
                throw ILSError(.invalidArgument, "the role must be device, gateway or admin")
            }
            let attributes = form["attributes", default: ""].split(separator: ",")
                .map { $0.trimmingCharacters(in: .whitespaces) }.filter { !$0.isEmpty }
            let lifetime = try Self.lifetime(form["expires", default: "24h"])
            let response = try await calls.createIdentity(
                ControllerAPI.CreateIdentityRequest(
                    name: name,
                    role: role,
                    attributes: attributes,
                    tokenLifetimeSeconds: lifetime
                )
            )
            logger.notice("console: identity created", metadata: ["identity": "\(name)", "actor": "\(calls.actor)"])
            return tokenPage(response, request, context)
        } catch {
            return await identitiesPage(request, context, status: Self.status(of: error), error: error.reason)
        }
    }

    private func changeIdentity(_ request: Request, _ context: ConsoleContext) async -> Response {
        let name = context.parameters.get("name") ?? ""
        let verb = context.parameters.get("verb") ?? ""
        do throws(ILSError) {
            try IdentityName.validate(name)
            switch verb {
            case "revoke", "disable", "enable":
                let record = try await calls.changeState(name, AdminCalls.StateVerb(rawValue: verb)!)
                logger.notice(
                    "console: identity \(record.state.rawValue)",
                    metadata: ["identity": "\(name)", "actor": "\(calls.actor)"]
                )
                return changed("/identities", notice: "\(name) was \(verb)d.", context: context)
            case "delete":
                try await calls.deleteIdentity(name)
                logger.notice(
                    "console: identity deleted",
                    metadata: ["identity": "\(name)", "actor": "\(calls.actor)"]
                )
                return changed("/identities", notice: "\(name) was deleted.", context: context)
            case "reissue":
                let response = try await calls.reissue(name, lifetime: 24 * 3600)
                logger.notice("console: token reissued", metadata: ["identity": "\(name)", "actor": "\(calls.actor)"])
                return tokenPage(response, request, context)
            default:
                throw ILSError(.notFound, "no such change")
            }
        } catch {
            return await identitiesPage(request, context, status: Self.status(of: error), error: error.reason)
        }
    }

    /// The one-time token as a QR code (a PNG in a `data:` URL, level M) and as its `ils-enroll://v1/` URI.
    private func tokenPage(
        _ response: ControllerAPI.TokenResponse,
        _ request: Request,
        _ context: ConsoleContext
    ) -> Response {
        let uri = EnrollmentURI.uri(for: response.token)
        var values: [String: Any] = [
            "name": response.identity.name, "uri": uri, "expires": Self.time(response.expiresAt),
        ]
        var error: String?
        do {
            values["png"] = Data(try QRMatrix.encode(uri, level: .medium).png(scale: 6)).base64EncodedString()
        } catch let failure {
            error = "The QR code could not be drawn (\(failure.reason)); use the URI below."
        }
        return page(
            "Enroll \(response.identity.name)",
            "token",
            values,
            context: context,
            error: error,
            request: request
        )
    }

    /// `30m`, `24h`, `7d`: as `--expires`.
    static func lifetime(_ text: String) throws(ILSError) -> Int64 {
        let seconds = try TimeSpan(parsing: text).nanoseconds / 1_000_000_000
        guard seconds > 0 else { throw ILSError(.invalidArgument, "the token must be valid for at least 1s") }
        return seconds
    }
}
