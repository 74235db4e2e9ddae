/// Who may dial (or bind) a service, in the OpenZiti style: roles, attributes and single identities, any of them or
/// all of them.
///
/// Tokens, as an admin writes them:
/// - `role:device`, `role:gateway`, `role:admin`: identities of that role;
/// - `#ipad`: identities that carry the attribute `ipad` (exact, case-sensitive);
/// - `@alice`: the identity named `alice`, resolved to its id when the policy is written, so a deleted and re-created
///   `alice` does not inherit access (stored and sent as `@id:ID`);
/// - `#all`: every identity, alone only.
///
/// `anyOf` allows an identity that matches at least one token; `allOf`, one that matches every token. An empty policy
/// allows nobody under either. The identity's state is not the policy's business: revoked and disabled identities are
/// refused before any policy is asked.
public struct ServicePolicy: Sendable, Hashable {
    public enum Semantic: String, Sendable, Hashable, Codable {
        case anyOf
        case allOf
    }

    public enum Token: Sendable, Hashable {
        case all
        case role(IdentityRole)
        case attribute(String)
        case identity(id: String)
    }

    public static let maximumTokens = 32
    /// The longest token text accepted: `@id:` and a 64-byte id, with room to spare.
    public static let maximumTokenBytes = 70

    public let semantic: Semantic
    public let tokens: [Token]

    /// A policy over `tokens`, duplicates dropped (first kept). Refuses what could never be meant: too many tokens,
    /// `#all` beside another token, and `allOf` over two roles or two identities (nobody could match).
    public init(_ semantic: Semantic, _ tokens: [Token]) throws(ILSError) {
        var unique: [Token] = []
        for token in tokens where !unique.contains(token) { unique.append(token) }
        guard unique.count <= Self.maximumTokens else {
            throw ILSError(.invalidArgument, "a policy holds at most \(Self.maximumTokens) tokens")
        }
        if unique.contains(.all), unique.count > 1 {
            throw ILSError(.invalidArgument, "'#all' stands alone in a policy")
        }
        if semantic == .allOf {
            let roles = unique.filter { if case .role = $0 { true } else { false } }
            let identities = unique.filter { if case .identity = $0 { true } else { false } }
            if roles.count > 1 || identities.count > 1 {
                throw ILSError(
                    .invalidArgument,
                    "an allOf policy with two roles or two identities would allow nobody; use anyOf"
                )
            }
        }
        self.semantic = semantic
        self.tokens = unique
    }

    /// Allows nobody: what an unreadable stored policy means.
    public static let nobody = ServicePolicy(unchecked: .anyOf, [])

    /// Whether `identity` may use the service (its state aside: that is checked before).
    public func allows(_ identity: IdentityRecord) -> Bool {
        allows(id: identity.id, role: identity.role, attributes: identity.attributes)
    }

    /// As an admin reads it: `anyOf(role:device, #ipad)`, identities as `@id:ID` (`describe(names:)` shows names).
    public var description: String { describe { _ in nil } }

    /// As an admin reads it, `@id:ID` shown as `@NAME` when `names` knows the id.
    public func describe(names: (String) -> String?) -> String {
        let texts = tokens.map { token -> String in
            if case .identity(let id) = token, let name = names(id) { return "@\(name)" }
            return token.text
        }
        return "\(semantic.rawValue)(\(texts.joined(separator: ", ")))"
    }

    /// The policy every service had before policies: any of these roles.
    public static func roles(_ roles: [IdentityRole]) -> ServicePolicy {
        // Cannot throw: roles are at most three distinct tokens, and anyOf takes any mix.
        (try? ServicePolicy(.anyOf, roles.map(Token.role))) ?? ServicePolicy(unchecked: .anyOf, [])
    }

    private init(unchecked semantic: Semantic, _ tokens: [Token]) {
        self.semantic = semantic
        self.tokens = tokens
    }

    /// Whether the identity `id`, of `role`, carrying `attributes`, may use the service.
    public func allows(id: String, role: IdentityRole, attributes: [String]) -> Bool {
        guard !tokens.isEmpty else { return false }
        let matches = { (token: Token) -> Bool in
            switch token {
            case .all: true
            case .role(let wanted): role == wanted
            case .attribute(let attribute): attributes.contains(attribute)
            case .identity(let wanted): id == wanted
            }
        }
        return semantic == .anyOf ? tokens.contains(where: matches) : tokens.allSatisfy(matches)
    }

    /// The roles the policy names: what a controller or gateway of an earlier release, which knows only roles, is
    /// told. For `anyOf` that release allows a subset of who this one does (attribute and identity tokens are left
    /// out); for `allOf` the role alone would allow more, so it is told nothing unless the role is the only token.
    public var legacyRoles: [IdentityRole] {
        let roles = tokens.compactMap { token -> IdentityRole? in
            if case .role(let role) = token { role } else { nil }
        }
        if semantic == .allOf, tokens.count > 1 { return [] }
        if tokens == [.all] { return IdentityRole.allCases }
        return roles
    }
}

extension ServicePolicy.Token {
    /// Parses one token as an admin writes it. `resolve` turns `@NAME` into the identity's id (nil: no such
    /// identity); `@id:ID` is taken as already resolved. Text from the network is never echoed beyond 70 bytes.
    public init(parsing text: String, resolve: (String) throws(ILSError) -> String?) throws(ILSError) {
        guard text.utf8.count <= ServicePolicy.maximumTokenBytes else {
            throw ILSError(.invalidArgument, "a policy token is at most \(ServicePolicy.maximumTokenBytes) bytes")
        }
        if text == "#all" {
            self = .all
        } else if text.hasPrefix("role:") {
            guard let role = IdentityRole(rawValue: String(text.dropFirst(5))) else {
                throw ILSError(
                    .invalidArgument,
                    "'\(ControlCharacters.escaped(text))' names no role; use role:device, role:gateway or role:admin"
                )
            }
            self = .role(role)
        } else if text.hasPrefix("#") {
            let attribute = String(text.dropFirst())
            try IdentityName.validate(attribute)
            self = .attribute(attribute)
        } else if text.hasPrefix("@id:") {
            let id = String(text.dropFirst(4))
            try IdentityName.validate(id)
            self = .identity(id: id)
        } else if text.hasPrefix("@") {
            let name = String(text.dropFirst())
            try IdentityName.validate(name)
            guard let id = try resolve(name) else {
                throw ILSError(.notFound, "no identity named '\(name)'")
            }
            self = .identity(id: id)
        } else {
            throw ILSError(
                .invalidArgument,
                "'\(ControlCharacters.escaped(text))' is not a policy token; use role:ROLE, #ATTRIBUTE, @NAME or #all"
            )
        }
    }

    /// The stored and wire form: identities as `@id:ID`.
    public var text: String {
        switch self {
        case .all: "#all"
        case .role(let role): "role:\(role.rawValue)"
        case .attribute(let attribute): "#\(attribute)"
        case .identity(let id): "@id:\(id)"
        }
    }
}

/// `{"semantic":"anyOf","tokens":["role:device","#ipad","@id:…"]}`: the JSON of the API, the store and the wire. A
/// policy read back is validated again, so a bad row or message is refused, never half-applied.
extension ServicePolicy: Codable {
    private enum CodingKeys: String, CodingKey {
        case semantic
        case tokens
    }

    public init(from decoder: any Decoder) throws {
        let container = try decoder.container(keyedBy: CodingKeys.self)
        let semantic = try container.decode(Semantic.self, forKey: .semantic)
        let texts = try container.decode([String].self, forKey: .tokens)
        guard texts.count <= Self.maximumTokens else {
            throw ILSError(.invalidArgument, "a policy holds at most \(Self.maximumTokens) tokens")
        }
        var tokens: [Token] = []
        for text in texts {
            // Stored and sent policies carry ids only: a bare `@NAME` here is refused, not looked up.
            tokens.append(try Token(parsing: text, resolve: { _ throws(ILSError) in nil }))
        }
        try self.init(semantic, tokens)
    }

    public func encode(to encoder: any Encoder) throws {
        var container = encoder.container(keyedBy: CodingKeys.self)
        try container.encode(semantic, forKey: .semantic)
        try container.encode(tokens.map(\.text), forKey: .tokens)
    }
}
