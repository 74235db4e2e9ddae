import ILSCore
import ILSFabric
import ILSStore
import Logging

/// Applies what other controllers wrote to this controller's directory, from `ControllerStore.changes()`, and acts
/// on it as this controller acts on its own writes: an identity another controller revoked, disabled, deleted or
/// re-certified has its connections here closed (and with them its circuits), and every gateway linked here is
/// sent the new block list. This is how a revocation through one controller cuts a device's streams on all of them.
///
/// SQLite's feed finishes at once (one controller per file), and so does this.
struct StoreFollower: Sendable {
    let controller: Controller
    let relay: Relay
    let live: LiveConnections
    let logger: Logger

    private var enforcement: PolicyEnforcement {
        PolicyEnforcement(controller: controller, relay: relay, live: live, logger: logger)
    }

    func follow() async {
        let state = controller.state
        for await change in state.store.changes() {
            do throws(ILSError) {
                switch change {
                case .identity(let id):
                    let (before, after) = try await state.identities.refresh(id: id, from: state.store)
                    await apply(before: before, after: after, id: id)
                    // Created, deleted, or its attributes changed: the grants that hold it may change.
                    if before?.attributes != after?.attributes || (before == nil) != (after == nil) {
                        enforcement.enforce()
                    }
                case .services:
                    let (before, after) = try await state.identities.refreshServices(from: state.store)
                    enforcement.servicesChanged(before: before, after: after)
                    let changed = Set(before.keys).union(after.keys).filter { before[$0] != after[$0] }.sorted()
                    if !changed.isEmpty {
                        logger.notice(
                            "services changed in the store; their policies apply here now",
                            metadata: ["services": "\(changed.joined(separator: ","))"]
                        )
                    }
                case .controllers:
                    // A replica joined or left: linked gateways hear it now rather than at the next heartbeat.
                    await state.roster.refresh(controller: controller, live: live)
                case .resynchronize:
                    let blockedBefore = state.identities.blockedIDs
                    let servicesBefore = state.identities.allServices()
                    try await state.identities.reload(from: state.store)
                    let blocked = state.identities.blockedIDs
                    for id in blocked.subtracting(blockedBefore) {
                        await live.close(identityID: id, blocked: "the identity is revoked, disabled or deleted")
                    }
                    live.push(HostControlMessage(blocked: controller.blockedIdentityIDs()))
                    enforcement.reloaded(servicesBefore: servicesBefore)
                    logger.notice("store notifications resumed; identities reloaded")
                }
            } catch {
                // The maintenance pass reloads the whole directory; until then the next change retries.
                logger.warning(
                    "could not apply a change from the store",
                    metadata: ["change": "\(change)", "error": "\(error.detail ?? error.reason)"]
                )
            }
        }
    }

    private func apply(before: IdentityRecord?, after: IdentityRecord?, id: String) async {
        let wasAdmitted = before.map { $0.state == .active || $0.state == .pending } ?? false
        let admitted = after.map { $0.state == .active || $0.state == .pending } ?? false
        let recertified =
            before?.certificateFingerprint != nil
            && before?.certificateFingerprint != after?.certificateFingerprint
        guard wasAdmitted && (!admitted || recertified) else {
            if !wasAdmitted && admitted, before != nil {
                // Enabled again elsewhere: gateways may admit it again.
                live.push(HostControlMessage(blocked: controller.blockedIdentityIDs()))
            }
            return
        }
        let name = after?.name ?? before?.name ?? id
        if admitted {
            live.close(identityID: id)
        } else {
            // Told before the gateways are: see `LiveConnections.close(identityID:blocked:)`.
            await live.close(identityID: id, blocked: "identity '\(name)' is \(after?.state.rawValue ?? "deleted")")
            live.push(HostControlMessage(blocked: controller.blockedIdentityIDs()))
        }
        logger.notice(
            // The feed also carries this controller's own writes, and may deliver one before the writer's own
            // update of the directory: the line says what is certain, that the store changed.
            "identity changed in the store; its connections here were closed",
            metadata: [
                "identity": "\(name)", "state": "\(after?.state.rawValue ?? "deleted")",
            ]
        )
    }
}
