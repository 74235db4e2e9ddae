import ILSAdmin
public import ILSCore
import ILSIdentity
import NIOHTTP1

/// The controller's admin API as the console calls it, with the console's admin identity. Typed calls only, so the
/// pages never build a path from unchecked text: every name is validated (`IdentityName`) before it goes into a
/// path, and query values are percent-encoded.
public struct AdminCalls: Sendable {
    let client: ControllerClient
    /// The name of the admin identity the console acts as: the audit log's actor for every change made here.
    public let actor: String

    public init(identityFile: IdentityFile) throws(ILSError) {
        self.client = try ControllerClient(identityFile: identityFile)
        self.actor = identityFile.identity.name
    }

    /// With the admin identity file at `path`, which learns the cluster's controllers from every answer
    /// (`ControllerClient.init(path:)`): the console fails over to a replica that joined after it started.
    public init(path: String) throws(ILSError) {
        self.client = try ControllerClient(path: path)
        self.actor = try IdentityFileIO.read(path).identity.name
    }

    func identities() async throws(ILSError) -> [IdentityRecord] {
        try await client.call(ControllerRoutes.identities)
    }

    func createIdentity(_ request: ControllerAPI.CreateIdentityRequest) async throws(ILSError)
        -> ControllerAPI.TokenResponse
    {
        try IdentityName.validate(request.name)
        return try await client.call(ControllerRoutes.createIdentity, body: request)
    }

    /// revoke, disable or enable.
    func changeState(_ name: String, _ verb: StateVerb) async throws(ILSError) -> IdentityRecord {
        try IdentityName.validate(name)
        return try await client.call(verb.route, name: name)
    }

    func deleteIdentity(_ name: String) async throws(ILSError) {
        try IdentityName.validate(name)
        _ = try await client.call(ControllerRoutes.deleteIdentity, name: name)
    }

    func reissue(_ name: String, lifetime: Int64) async throws(ILSError) -> ControllerAPI.TokenResponse {
        try IdentityName.validate(name)
        return try await client.call(
            ControllerRoutes.reissueIdentity,
            name: name,
            body: ControllerAPI.ReissueRequest(tokenLifetimeSeconds: lifetime)
        )
    }

    /// Every controller's answer to `route` (the sessions and the services' hosts live in each controller's memory).
    func everyController<Value: Decodable & Sendable>(_ route: ControllerRoute<NoBody, Value>) async throws(ILSError)
        -> ClusterCalls.Gathered<Value>
    {
        try await ClusterCalls.gather(client, route)
    }

    func createService(_ request: ControllerAPI.ServiceRequest) async throws(ILSError) {
        try IdentityName.validate(request.name ?? "")
        _ = try await client.call(ControllerRoutes.createService, body: request)
    }

    func service(_ name: String) async throws(ILSError) -> ControllerAPI.ServiceInfo {
        try IdentityName.validate(name)
        return try await client.call(ControllerRoutes.service, name: name)
    }

    func updateService(_ name: String, _ request: ControllerAPI.ServiceRequest) async throws(ILSError) {
        try IdentityName.validate(name)
        _ = try await client.call(ControllerRoutes.updateService, name: name, body: request)
    }

    func deleteService(_ name: String) async throws(ILSError) {
        try IdentityName.validate(name)
        _ = try await client.call(ControllerRoutes.deleteService, name: name)
    }

    func audit(before: Int64?, limit: Int, filter: ControllerAPI.AuditFilter) async throws(ILSError)
        -> ControllerAPI.AuditPage
    {
        var query = [("limit", "\(limit)")]
        if let before { query.append(("before", "\(before)")) }
        return try await client.call(ControllerRoutes.audit, query: query + filter.queryItems)
    }

    enum StateVerb: String, Sendable {
        case revoke, disable, enable

        var route: ControllerRoute<NoBody, IdentityRecord> {
            switch self {
            case .revoke: ControllerRoutes.revokeIdentity
            case .disable: ControllerRoutes.disableIdentity
            case .enable: ControllerRoutes.enableIdentity
            }
        }
    }
}
