/// How a gateway that serves devices itself (HTTP mode with client certificates) asks the controller for its
/// service's policy and the block list without hosting circuits.
extension FabricProtocol {
    /// Header of the gateway's answer on the control stream that says what the link is for. Absent: the link hosts
    /// circuits (every overlay gateway). `policyLink`: the controller sends the dial policy and every block-list
    /// change, and never opens a circuit on it (it is not registered with the relay).
    public static let linkPurposeHeader = "ils-link"
    /// The value of `linkPurposeHeader` for a policy-only link.
    public static let policyLink = "policy"
}

/// A policy link's question about one client's certificate, sent by the gateway on the control stream as a JSON
/// line when the client connects: is the identity still active, and is this still its current certificate? The
/// controller answers from its store, as the relay checks every circuit (a deleted identity, or a certificate
/// replaced by `renew` or `reissue`, is in no block list, but the store knows).
public struct CertificateCheck: Codable, Sendable {
    /// Matches the answer to the question.
    public var check: Int
    public var id: String
    /// SHA-256 of the certificate's DER, as `IdentityCertificate.fingerprint`.
    public var fingerprint: String

    public init(check: Int, id: String, fingerprint: String) {
        self.check = check
        self.id = id
        self.fingerprint = fingerprint
    }
}

/// The controller's answer to a `CertificateCheck`, on the same stream.
public struct CertificateVerdict: Codable, Sendable {
    /// The `check` it answers.
    public var verdict: Int
    public var allowed: Bool
    /// Why not, when not allowed (a sentence for the client's refusal).
    public var reason: String?
    /// With `allowed`: whether the link's service's dial policy allows the identity, as the controller's directory
    /// holds it now. Fresher than the gateway's grant, which a new identity or a policy change reaches a moment after
    /// the change (a device that dials straight after enrolling could otherwise meet a grant without it). Absent from
    /// controllers before it: the gateway's grant then decides alone.
    public var dial: Bool?

    public init(verdict: Int, allowed: Bool, reason: String? = nil, dial: Bool? = nil) {
        self.verdict = verdict
        self.allowed = allowed
        self.reason = reason
        self.dial = dial
    }
}
