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
