public import ILSCore
public import ILSFabric
public import ILSStore

/// Services and their policies: the admin API's writes, and what the data path asks of them (who may dial now).
///
/// A write is stored first (with its audit row), then applied to the directory; the caller (`ControllerRouter`) then
/// has `PolicyEnforcement` cut what the change no longer allows before it answers, as a revocation does.
extension Controller {
    /// The most attributes one identity carries (policies match on them; the grant is computed from them).
    public static let maximumAttributes = 32

    /// `POST /v1/admin/services`.
    public func createService(_ request: ControllerAPI.ServiceRequest, actor: String) async throws(ILSError)
        -> ServiceRecord
    {
        guard let name = request.name else { throw ILSError(.invalidArgument, "a service needs a name") }
        try IdentityName.validate(name)
        var service = ServiceRecord(name: name, dial: .roles([.device]), bind: .roles([.gateway]))
        if let dial = request.dial { service.dial = try await policy(from: dial) }
        if let bind = request.bind { service.bind = try await policy(from: bind) }
        _ = try grantWithinBounds(service)
        try await state.store.createService(service, actor: actor)
        state.identities.apply(service)
        return service
    }

    /// `PUT /v1/admin/services/NAME`: replaces the policies given, if the revision is still the one the caller read.
    public func updateService(named name: String, _ request: ControllerAPI.ServiceRequest, actor: String)
        async throws(ILSError) -> ServiceRecord
    {
        guard let revision = request.revision else {
            throw ILSError(.invalidArgument, "an update needs the revision it was made from ('revision')")
        }
        if let renamed = request.name, renamed != name {
            throw ILSError(.invalidArgument, "a service cannot be renamed; create one under the new name")
        }
        guard let current = try await state.store.service(named: name) else {
            throw ILSError(.notFound, "no service named '\(name)'")
        }
        var service = current
        if let dial = request.dial { service.dial = try await policy(from: dial) }
        if let bind = request.bind { service.bind = try await policy(from: bind) }
        _ = try grantWithinBounds(service)
        let updated = try await state.store.updateService(service, expectedRevision: revision, actor: actor)
        state.identities.apply(updated)
        return updated
    }

    /// `DELETE /v1/admin/services/NAME`. Returns the record it removed.
    public func deleteService(named name: String, actor: String) async throws(ILSError) -> ServiceRecord {
        guard let deleted = try await state.store.deleteService(named: name, actor: actor) else {
            throw ILSError(.notFound, "no service named '\(name)'")
        }
        state.identities.removeService(named: name)
        return deleted
    }

    /// `PUT /v1/admin/identities/NAME/attributes`.
    public func updateAttributes(named name: String, attributes: [String], actor: String) async throws(ILSError)
        -> IdentityRecord
    {
        try Self.validateAttributes(attributes)
        var unique: [String] = []
        for attribute in attributes where !unique.contains(attribute) { unique.append(attribute) }
        if var changed = state.identities.identity(named: name) {
            changed.attributes = unique
            try checkGrantRoom(for: changed)
        }
        let record = try await state.store.updateAttributes(named: name, attributes: unique, actor: actor)
        state.identities.apply(record)
        return record
    }

    static func validateAttributes(_ attributes: [String]) throws(ILSError) {
        guard attributes.count <= maximumAttributes else {
            throw ILSError(.invalidArgument, "an identity carries at most \(maximumAttributes) attributes")
        }
        for attribute in attributes {
            do throws(ILSError) {
                try IdentityName.validate(attribute)
            } catch {
                throw ILSError(
                    .invalidArgument,
                    "'\(ControlCharacters.escaped(String(attribute.prefix(80))))' is not a valid attribute; "
                        + "use 1-64 letters, digits, '.', '_' or '-'"
                )
            }
            // `#all` in a policy means everyone: an attribute of that name could never be matched on its own.
            guard attribute != "all" else {
                throw ILSError(.invalidArgument, "'all' cannot be an attribute: '#all' in a policy means everyone")
            }
        }
    }

    /// Refuses (`.conflict`) a new or changed identity that would take a service's dial grant past
    /// `DialGrant.maximumIdentities`: gateways drop a larger grant whole.
    func checkGrantRoom(for identity: IdentityRecord) throws(ILSError) {
        for service in state.identities.allServices().values where service.dial.allows(identity) {
            let grant = dialGrant(for: service)
            if grant.identities.count >= DialGrant.maximumIdentities, !grant.identities.contains(identity.id) {
                throw ILSError(
                    .conflict,
                    "'\(service.name)' already grants \(DialGrant.maximumIdentities) identities, as many as a gateway "
                        + "is sent; narrow its dial policy first"
                )
            }
        }
    }

    /// A policy from the API's text, `@NAME` resolved to the identity's id through the store (so a name another
    /// controller just created resolves too).
    func policy(from text: ControllerAPI.PolicyText) async throws(ILSError) -> ServicePolicy {
        guard text.tokens.count <= ServicePolicy.maximumTokens else {
            throw ILSError(.invalidArgument, "a policy holds at most \(ServicePolicy.maximumTokens) tokens")
        }
        var ids: [String: String] = [:]
        for token in text.tokens where token.hasPrefix("@") && !token.hasPrefix("@id:") {
            let name = String(token.dropFirst())
            try IdentityName.validate(name)
            guard let identity = try await state.store.identity(named: name) else {
                throw ILSError(.notFound, "no identity named '\(name)'")
            }
            ids[name] = identity.id
        }
        var tokens: [ServicePolicy.Token] = []
        for token in text.tokens {
            tokens.append(try ServicePolicy.Token(parsing: token, resolve: { name throws(ILSError) in ids[name] }))
        }
        return try ServicePolicy(text.semantic, tokens)
    }

    /// The policy as the API shows it: `@NAME` for identities that exist, `@id:ID` for those that are gone.
    func policyText(_ policy: ServicePolicy) -> ControllerAPI.PolicyText {
        ControllerAPI.PolicyText(
            semantic: policy.semantic,
            tokens: policy.tokens.map { token in
                if case .identity(let id) = token, let name = state.identities.identity(id: id)?.name {
                    return "@\(name)"
                }
                return token.text
            }
        )
    }

    /// The API's view of a service; `dialers` only when asked for (one service's page).
    func serviceInfo(_ service: ServiceRecord, hosts: [ControllerAPI.ServiceHost], dialers: Bool = false)
        -> ControllerAPI.ServiceInfo
    {
        var info = ControllerAPI.ServiceInfo(
            name: service.name,
            dial: policyText(service.dial),
            bind: policyText(service.bind),
            revision: service.revision,
            hosts: hosts
        )
        if dialers {
            let names = allowedToDial(service).map(\.name)
                .sorted()
            info.dialers = Array(names.prefix(ControllerAPI.ServiceInfo.maximumDialers))
            info.dialersTruncated = names.count > ControllerAPI.ServiceInfo.maximumDialers
        }
        return info
    }

    /// Who may dial `service` now, as gateways enforce it: every identity that is not revoked and that the dial
    /// policy matches, by id. Disabled identities stay in it (the block list keeps them out, and enabling one again
    /// then needs no new grant).
    public func dialGrant(for service: ServiceRecord) -> DialGrant {
        let ids = allowedToDial(service).map(\.id).sorted()
        return DialGrant(service: service.name, policy: service.dial.description, identities: ids)
    }

    /// The identities that may dial `service` now: not revoked, and matched by its dial policy.
    private func allowedToDial(_ service: ServiceRecord) -> [IdentityRecord] {
        state.identities.all().filter { $0.state != .revoked && service.dial.allows($0) }
    }

    /// The grant `service` would have, refused (`.conflict`) when it is too large to send.
    func grantWithinBounds(_ service: ServiceRecord) throws(ILSError) -> DialGrant {
        let grant = dialGrant(for: service)
        guard grant.identities.count <= DialGrant.maximumIdentities else {
            throw ILSError(
                .conflict,
                "the dial policy of '\(service.name)' would allow \(grant.identities.count) identities, more than "
                    + "the \(DialGrant.maximumIdentities) a gateway is sent; narrow it with an attribute"
            )
        }
        return grant
    }
}
