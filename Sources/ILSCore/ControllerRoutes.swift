/// The controller API, every route declared once: its method, its path (with at most one `{name}`, an identity's or
/// a service's), the JSON its request carries and the JSON it answers. The controller's router matches requests
/// against this table and switches over `ControllerEndpoint` (a route it does not serve does not compile), and
/// `ControllerClient.call` builds requests from it, so no path is spelled anywhere else (`test_route_table.py`).
///
/// Why not Hummingbird's router, which the console already links: the API shares one TLS port with the overlay's
/// HTTP/2, told apart by ALPN in one NIO pipeline (`ControllerServer`), and its HTTP/1.1 handler carries the
/// controller's own deadlines per request (`APIRequestDeadlineHandler`) and the caller's verified certificate. Serving
/// it from Hummingbird would mean a second server behind that split, handed connections it did not accept; matching
/// 23 fixed routes is a table lookup, and the table is what the client needs anyway.
public enum ControllerEndpoint: String, CaseIterable, Sendable {
    case health, enrollInfo, enroll, renew, controllers, whoami
    case identities, createIdentity, identity, deleteIdentity, identityAttributes
    case revokeIdentity, disableIdentity, enableIdentity, reissueIdentity
    case services, service, createService, updateService, deleteService
    case sessions, audit, clusterJoin

    /// The HTTP method, as on the wire.
    public var method: String {
        switch self {
        case .enroll, .renew, .createIdentity, .revokeIdentity, .disableIdentity, .enableIdentity, .reissueIdentity,
            .createService, .clusterJoin:
            "POST"
        case .identityAttributes, .updateService: "PUT"
        case .deleteIdentity, .deleteService: "DELETE"
        case .health, .enrollInfo, .controllers, .whoami, .identities, .identity, .services, .service, .sessions,
            .audit:
            "GET"
        }
    }

    /// The path, `{name}` standing for the identity's or service's name.
    public var template: String {
        switch self {
        case .health: "/v1/health"
        case .enrollInfo: "/v1/enroll/info"
        case .enroll: "/v1/enroll"
        case .renew: "/v1/renew"
        case .controllers: "/v1/controllers"
        case .whoami: "/v1/whoami"
        case .identities, .createIdentity: "/v1/admin/identities"
        case .identity, .deleteIdentity: "/v1/admin/identities/{name}"
        case .identityAttributes: "/v1/admin/identities/{name}/attributes"
        case .revokeIdentity: "/v1/admin/identities/{name}/revoke"
        case .disableIdentity: "/v1/admin/identities/{name}/disable"
        case .enableIdentity: "/v1/admin/identities/{name}/enable"
        case .reissueIdentity: "/v1/admin/identities/{name}/reissue"
        case .services, .createService: "/v1/admin/services"
        case .service, .updateService, .deleteService: "/v1/admin/services/{name}"
        case .sessions: "/v1/admin/sessions"
        case .audit: "/v1/admin/audit"
        case .clusterJoin: "/v1/admin/cluster/join"
        }
    }

    /// The segments every admin route's path starts with; the controller asks for an admin's certificate first.
    public static let adminPrefix: [Substring] = ["v1", "admin"]

    /// Whether the route is the admin API's.
    public var isAdmin: Bool { segments.starts(with: Self.adminPrefix) }

    var segments: [Substring] { template.split(separator: "/") }

    /// The route `method` and `path` name, and the name in it if it has one. Empty segments are ignored
    /// (`//v1//health` is `/v1/health`); the query is the caller's to split off first.
    public static func match(method: String, path: String) -> (endpoint: ControllerEndpoint, name: String?)? {
        let parts = path.split(separator: "/")
        for endpoint in allCases where endpoint.method == method {
            let pattern = endpoint.segments
            guard pattern.count == parts.count else { continue }
            var name: String?
            var matched = true
            for (expected, part) in zip(pattern, parts) {
                if expected == "{name}" {
                    name = String(part)
                } else if expected != part {
                    matched = false
                    break
                }
            }
            if matched { return (endpoint, name) }
        }
        return nil
    }

    /// The path for a request: `name` in place of `{name}`, and `query` after it; both percent-encoded but for
    /// RFC 3986's unreserved characters, so a name cannot reach another route.
    public func path(name: String? = nil, query: [(String, String)] = []) -> String {
        var path = ""
        for segment in segments {
            path += "/" + (segment == "{name}" ? Self.percentEncoded(name ?? "") : String(segment))
        }
        for (index, (key, value)) in query.enumerated() {
            path += (index == 0 ? "?" : "&") + Self.percentEncoded(key) + "=" + Self.percentEncoded(value)
        }
        return path
    }

    /// `text` with every byte but RFC 3986's unreserved characters as `%XX`.
    public static func percentEncoded(_ text: String) -> String {
        var encoded = ""
        for byte in text.utf8 {
            switch byte {
            case UInt8(ascii: "A")...UInt8(ascii: "Z"), UInt8(ascii: "a")...UInt8(ascii: "z"),
                UInt8(ascii: "0")...UInt8(ascii: "9"), UInt8(ascii: "-"), UInt8(ascii: "."), UInt8(ascii: "_"),
                UInt8(ascii: "~"):
                encoded.unicodeScalars.append(Unicode.Scalar(byte))
            default:
                encoded.unicodeScalars.append("%")
                encoded.unicodeScalars.append(hexDigits[Int(byte >> 4)])
                encoded.unicodeScalars.append(hexDigits[Int(byte & 0xF)])
            }
        }
        return encoded
    }

    private static let hexDigits = Array("0123456789ABCDEF".unicodeScalars)
}

/// A request without a body.
public struct NoBody: Codable, Sendable {}

/// A controller API route with its types: what `ControllerClient.call` sends and what it decodes.
public struct ControllerRoute<Body: Encodable & Sendable, Answer: Decodable & Sendable>: Sendable {
    public let endpoint: ControllerEndpoint

    init(_ endpoint: ControllerEndpoint) { self.endpoint = endpoint }
}

/// Every route of `ControllerEndpoint` with its request and answer types.
public enum ControllerRoutes {
    public static let health = ControllerRoute<NoBody, [String: String]>(.health)
    public static let enrollInfo = ControllerRoute<NoBody, ControllerAPI.EnrollInfo>(.enrollInfo)
    public static let enroll = ControllerRoute<ControllerAPI.EnrollRequest, ControllerAPI.EnrollResponse>(.enroll)
    public static let renew = ControllerRoute<ControllerAPI.RenewRequest, ControllerAPI.EnrollResponse>(.renew)
    public static let controllers = ControllerRoute<NoBody, [ControllerAPI.ControllerInfo]>(.controllers)
    public static let whoami = ControllerRoute<NoBody, IdentityRecord>(.whoami)
    public static let identities = ControllerRoute<NoBody, [IdentityRecord]>(.identities)
    public static let createIdentity = ControllerRoute<
        ControllerAPI.CreateIdentityRequest, ControllerAPI.TokenResponse
    >(
        .createIdentity
    )
    public static let identity = ControllerRoute<NoBody, IdentityRecord>(.identity)
    public static let deleteIdentity = ControllerRoute<NoBody, [String: String]>(.deleteIdentity)
    public static let identityAttributes = ControllerRoute<ControllerAPI.AttributesRequest, IdentityRecord>(
        .identityAttributes
    )
    public static let revokeIdentity = ControllerRoute<NoBody, IdentityRecord>(.revokeIdentity)
    public static let disableIdentity = ControllerRoute<NoBody, IdentityRecord>(.disableIdentity)
    public static let enableIdentity = ControllerRoute<NoBody, IdentityRecord>(.enableIdentity)
    public static let reissueIdentity = ControllerRoute<ControllerAPI.ReissueRequest, ControllerAPI.TokenResponse>(
        .reissueIdentity
    )
    public static let services = ControllerRoute<NoBody, [ControllerAPI.ServiceInfo]>(.services)
    public static let service = ControllerRoute<NoBody, ControllerAPI.ServiceInfo>(.service)
    public static let createService = ControllerRoute<ControllerAPI.ServiceRequest, ControllerAPI.ServiceInfo>(
        .createService
    )
    public static let updateService = ControllerRoute<ControllerAPI.ServiceRequest, ControllerAPI.ServiceInfo>(
        .updateService
    )
    public static let deleteService = ControllerRoute<NoBody, [String: String]>(.deleteService)
    public static let sessions = ControllerRoute<NoBody, [ControllerAPI.Session]>(.sessions)
    public static let audit = ControllerRoute<NoBody, ControllerAPI.AuditPage>(.audit)
    public static let clusterJoin = ControllerRoute<ControllerAPI.JoinRequest, ControllerAPI.JoinResponse>(
        .clusterJoin
    )
}
