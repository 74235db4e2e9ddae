extension ControllerAPI {
    /// A policy as the API reads and writes it: `{"semantic":"anyOf","tokens":["role:device","#ipad","@alice"]}`.
    /// Written, `@NAME` names an existing identity (the controller stores its id); read back, it is `@NAME` while the
    /// identity exists and `@id:ID` once it is gone.
    public struct PolicyText: Codable, Sendable, Hashable {
        public var semantic: ServicePolicy.Semantic
        public var tokens: [String]

        public init(semantic: ServicePolicy.Semantic, tokens: [String]) {
            self.semantic = semantic
            self.tokens = tokens
        }

        /// `anyOf(role:device, #ipad)`.
        public var description: String { "\(semantic.rawValue)(\(tokens.joined(separator: ", ")))" }
    }

    /// `POST /v1/admin/services` (all of `name`; `dial` and `bind` default to `anyOf role:device` and
    /// `anyOf role:gateway`) and `PUT /v1/admin/services/NAME` (`revision` required: the one read; a policy left out
    /// stays as it is).
    public struct ServiceRequest: Codable, Sendable {
        public var name: String?
        public var dial: PolicyText?
        public var bind: PolicyText?
        public var revision: Int64?

        public init(name: String? = nil, dial: PolicyText? = nil, bind: PolicyText? = nil, revision: Int64? = nil) {
            self.name = name
            self.dial = dial
            self.bind = bind
            self.revision = revision
        }
    }

    /// A gateway identity hosting a service through one controller, with how many links it keeps there.
    public struct ServiceHost: Codable, Sendable, Hashable {
        public var gateway: String
        public var links: Int
        /// The controller the links are to (its address).
        public var controller: String

        public init(gateway: String, links: Int, controller: String) {
            self.gateway = gateway
            self.links = links
            self.controller = controller
        }
    }

    /// A service as `GET /v1/admin/services[/NAME]` answers. `hosts` are the gateways linked to the answering
    /// controller (several controllers: ask each). `dialers`, in the answer for one service, are the names of the
    /// identities the dial policy allows now, at most `maximumDialers` (`dialersTruncated` when there were more).
    public struct ServiceInfo: Codable, Sendable, Hashable {
        public static let maximumDialers = 200

        public var name: String
        public var dial: PolicyText
        public var bind: PolicyText
        public var revision: Int64
        public var hosts: [ServiceHost]
        public var dialers: [String]?
        public var dialersTruncated: Bool?

        public init(
            name: String,
            dial: PolicyText,
            bind: PolicyText,
            revision: Int64,
            hosts: [ServiceHost],
            dialers: [String]? = nil,
            dialersTruncated: Bool? = nil
        ) {
            self.name = name
            self.dial = dial
            self.bind = bind
            self.revision = revision
            self.hosts = hosts
            self.dialers = dialers
            self.dialersTruncated = dialersTruncated
        }
    }

    /// `PUT /v1/admin/identities/NAME/attributes`: the identity's attributes, replaced whole (`[]` clears them).
    public struct AttributesRequest: Codable, Sendable {
        public var attributes: [String]

        public init(attributes: [String]) {
            self.attributes = attributes
        }
    }
}
