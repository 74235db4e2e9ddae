public import ILSCore
public import NIOCore

/// The message the controller sends a gateway on the control stream after checking its bind permission.
public struct HostControlMessage: Codable, Sendable {
    /// The `errorCode` of a refusal of the identity itself.
    public static let identityBlocked = "identity_blocked"

    /// Roles allowed to dial the service; the gateway enforces this itself on every circuit.
    public var dialRoles: [IdentityRole]?
    /// Ids of identities that must not be let in (revoked or disabled), whatever their certificate says: the full
    /// list, sent on every (re)connection and again whenever it changes.
    public var blocked: [String]?
    /// Exactly who may dial the hosted service now, by identity id: the controller's policy (roles, attributes,
    /// single identities) resolved, since a gateway cannot see attributes. In the binding answer beside `dialRoles`,
    /// and pushed alone (never with `dialRoles`, whose presence means "bound") whenever the policy or an identity
    /// changes. A gateway of an earlier release ignores it and enforces `dialRoles`.
    public var dialGrant: DialGrant?
    /// Set instead when the gateway may not host the service.
    public var error: String?
    /// With `error`: `identity_blocked` when the gateway's identity may not link at all (revoked, disabled, deleted,
    /// or this certificate replaced by `renew` or `reissue`), which does not heal by itself, so the gateway backs off
    /// to minutes; absent for a refusal of the service (no such service, bind policy), which an admin may fix soon.
    public var errorCode: String?
    /// The controller's event loop this connection landed on (`0..<relayLoops`), in the first message only. The
    /// relay splices a device's circuit onto a gateway connection on the device connection's own loop when it has
    /// one, so the circuit's bytes never cross threads; a gateway keeps one connection per loop to allow that.
    public var relayLoop: Int?
    /// How many event loops the controller's relay runs, in the first message only.
    public var relayLoops: Int?
    /// Every controller replica sharing the store, the sending one first: in the binding answer, and again whenever
    /// the list changes. The gateway links to each (and stops redialling one that left the list).
    public var controllers: [String]?

    public init(
        dialRoles: [IdentityRole]? = nil,
        blocked: [String]? = nil,
        dialGrant: DialGrant? = nil,
        error: String? = nil,
        errorCode: String? = nil,
        relayLoop: Int? = nil,
        relayLoops: Int? = nil,
        controllers: [String]? = nil
    ) {
        self.dialRoles = dialRoles
        self.blocked = blocked
        self.dialGrant = dialGrant
        self.error = error
        self.errorCode = errorCode
        self.relayLoop = relayLoop
        self.relayLoops = relayLoops
        self.controllers = controllers
    }
}

/// Who may dial a service now (`HostControlMessage.dialGrant`).
public struct DialGrant: Codable, Sendable, Hashable {
    /// The most ids one grant carries (about 0.8 MB as a line, under the gateway's 4 MiB bound on a control line).
    public static let maximumIdentities = 20_000

    public var service: String
    /// The policy as text, for the gateway's log (`anyOf(role:device, #ipad)`).
    public var policy: String
    /// Ids of the identities allowed: not revoked, and matched by the dial policy.
    public var identities: [String]

    public init(service: String, policy: String, identities: [String]) {
        self.service = service
        self.policy = policy
        self.identities = identities
    }
}

/// The controller's event loops, numbered, so a gateway connection can be told which one it landed on.
public struct RelayLoops: Sendable {
    private let indices: [ObjectIdentifier: Int]
    public let count: Int

    public init(_ group: any EventLoopGroup) {
        var indices: [ObjectIdentifier: Int] = [:]
        for loop in group.makeIterator() { indices[ObjectIdentifier(loop)] = indices.count }
        self.indices = indices
        self.count = indices.count
    }

    public func index(of loop: any EventLoop) -> Int? { indices[ObjectIdentifier(loop)] }
}
