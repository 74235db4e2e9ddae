/// The enrolled identity on the far end of a circuit, as verified by the gateway itself.
///
/// A value of this type is only ever made after the peer's certificate chain and end-to-end signature were checked;
/// the proxy core passes it to the backend as `X-ILS-Identity` and `X-ILS-Identity-Id`.
public struct PeerIdentity: Hashable, Sendable {
    /// The identity's stable id, assigned by the controller.
    public let id: String
    /// The human name an admin gave the identity, e.g. `ipad`.
    public let name: String

    public init(id: String, name: String) {
        self.id = id
        self.name = name
    }
}
