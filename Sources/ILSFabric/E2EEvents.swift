public import ILSCore

/// Fired inbound once the end-to-end handshake has completed and the peer is proven.
public struct E2EEstablishedEvent: Sendable {
    public let peer: PeerIdentity
    public let service: String
}

/// What the gateway decides about a device asking for a service, before it answers the handshake.
public enum AccessDecision: Sendable, Equatable {
    case allow
    case deny(reason: String)
}
