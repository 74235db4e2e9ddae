import ILSFabric
import ILSIdentity

extension IdentityKeeper {
    /// After the controller refused a link with `code`: if it refused the identity's certificate and the identity file
    /// holds another one (a renewal made elsewhere replaced it), moves to that one with `adopt` at once. Returns
    /// whether it did, so the link dials again now instead of waiting out the refusal.
    func movedOn(afterRefusal code: String?, adopt: (Change) -> Bool) -> Bool {
        guard code == HostControlMessage.identityBlocked, let changed = changedOnDisk(), adopt(.changedOnDisk(changed))
        else { return false }
        adopted(changed)
        return true
    }
}
