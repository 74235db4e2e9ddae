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
        try await client.call(.GET, "/v1/admin/identities")
    }

    func createIdentity(_ request: ControllerAPI.CreateIdentityRequest) async throws(ILSError)
        -> ControllerAPI.TokenResponse
    {
        try IdentityName.validate(request.name)
        return try await client.call(.POST, "/v1/admin/identities", body: request)
    }

    /// revoke, disable or enable.
    func changeState(_ name: String, _ verb: StateVerb) async throws(ILSError) -> IdentityRecord {
        try IdentityName.validate(name)
        return try await client.call(.POST, "/v1/admin/identities/\(name)/\(verb.rawValue)")
    }

    func deleteIdentity(_ name: String) async throws(ILSError) {
        try IdentityName.validate(name)
        let _: [String: String] = try await client.call(.DELETE, "/v1/admin/identities/\(name)")
    }

    func reissue(_ name: String, lifetime: Int64) async throws(ILSError) -> ControllerAPI.TokenResponse {
        try IdentityName.validate(name)
        return try await client.call(
            .POST,
            "/v1/admin/identities/\(name)/reissue",
            body: ControllerAPI.ReissueRequest(tokenLifetimeSeconds: lifetime)
        )
    }

    /// Every controller's answer to `path` (the sessions and the services' hosts live in each controller's memory).
    func everyController<Value: Decodable & Sendable>(_ path: String, as type: Value.Type) async throws(ILSError)
        -> ClusterCalls.Gathered<Value>
    {
        try await ClusterCalls.gather(client, path, as: type)
    }

    func createService(_ request: ControllerAPI.ServiceRequest) async throws(ILSError) {
        try IdentityName.validate(request.name ?? "")
        let _: ControllerAPI.ServiceInfo = try await client.call(.POST, "/v1/admin/services", body: request)
    }

    func service(_ name: String) async throws(ILSError) -> ControllerAPI.ServiceInfo {
        try IdentityName.validate(name)
        return try await client.call(.GET, "/v1/admin/services/\(name)")
    }

    func updateService(_ name: String, _ request: ControllerAPI.ServiceRequest) async throws(ILSError) {
        try IdentityName.validate(name)
        let _: ControllerAPI.ServiceInfo = try await client.call(.PUT, "/v1/admin/services/\(name)", body: request)
    }

    func deleteService(_ name: String) async throws(ILSError) {
        try IdentityName.validate(name)
        let _: [String: String] = try await client.call(.DELETE, "/v1/admin/services/\(name)")
    }

    func audit(before: Int64?, limit: Int, filter: ControllerAPI.AuditFilter) async throws(ILSError)
        -> ControllerAPI.AuditPage
    {
        var path = "/v1/admin/audit?limit=\(limit)"
        if let before { path += "&before=\(before)" }
        path += filter.queryParameters
        return try await client.call(.GET, path)
    }

    enum StateVerb: String, Sendable {
        case revoke, disable, enable
    }
}
