import ILSCore
import ILSFabric
import ILSStore
import Logging

/// Makes a policy change take effect at once, as a revocation does, whoever made it: this controller's admin API
/// (before it answers) or another controller sharing the store (`StoreFollower`).
///
/// For each service it recomputes the dial grant from the directory, ends the circuits spliced here whose device the
/// grant no longer holds, sends the grant to every gateway of the service linked here (which ends its own circuits of
/// those devices and refuses new ones), and closes the links of gateways the bind policy no longer allows. A deleted
/// service loses every circuit and every link.
struct PolicyEnforcement: Sendable {
    let controller: Controller
    let relay: Relay
    let live: LiveConnections
    let logger: Logger

    /// Applies the services as the directory holds them now, and removes those in `removed`.
    func enforce(removed: [String] = []) {
        for service in controller.state.identities.allServices().values.sorted(by: { $0.name < $1.name }) {
            enforce(service)
        }
        for name in removed { remove(name) }
    }

    /// After the services changed from `before` to `after` (another controller's write).
    func servicesChanged(before: [String: ServiceRecord], after: [String: ServiceRecord]) {
        for (name, service) in after where before[name] != service { enforce(service) }
        for name in before.keys where after[name] == nil { remove(name) }
    }

    /// After the directory was read whole again (a gap in the store's notifications, or the maintenance pass's
    /// backstop): every service as it is now, and the ones that went away meanwhile removed.
    func reloaded(servicesBefore before: [String: ServiceRecord]) {
        let after = controller.state.identities.allServices()
        enforce(removed: before.keys.filter { after[$0] == nil }.sorted())
    }

    /// What the grants are computed from, to tell whether a reload changed any: the services, and each identity's
    /// attributes and whether it is revoked.
    struct Inputs: Equatable, Sendable {
        let services: [String: ServiceRecord]
        let identities: [String: [String]]

        init(_ directory: IdentityDirectory) {
            services = directory.allServices()
            identities = Dictionary(
                directory.all().map { ($0.id, $0.state == .revoked ? ["\u{0}revoked"] : $0.attributes) },
                uniquingKeysWith: { $1 }
            )
        }
    }

    /// After the maintenance pass read the directory whole again: enforces only if that changed what the grants
    /// are computed from (a notification this controller missed).
    func reloaded(before: Inputs) {
        let after = Inputs(controller.state.identities)
        guard after != before else { return }
        logger.notice("the directory's reload changed services or attributes; enforcing the policies again")
        reloaded(servicesBefore: before.services)
    }

    /// Enforces the service as the directory holds it now (not as a caller read it earlier: an older record pushed
    /// after a newer one would widen a narrowed grant again). Gone from the directory: removed.
    func enforce(_ service: ServiceRecord) {
        enforce(named: service.name)
    }

    func enforce(named name: String) {
        let directory = controller.state.identities
        // Computed and sent under one lock, so grants reach each control stream in the order they were computed.
        // The relay cuts first: a gateway that got the grant first would end the circuit itself, the relay would then
        // find no session to cut, and the cut would go unaudited (seen under load in CI).
        var cut: [ControllerAPI.Session] = []
        guard
            let (service, _) = live.publishGrant(
                compute: {
                    directory.service(named: name).map { ($0, controller.dialGrant(for: $0)) }
                },
                beforePush: { service, grant in
                    cut = relay.cut(service: service.name, keeping: Set(grant.identities))
                }
            )
        else {
            remove(name)
            return
        }
        for session in cut {
            controller.state.auditQueue.append(
                actor: "controller",
                action: "circuit.cut",
                target: session.device,
                detail: "the dial policy of '\(service.name)' no longer allows it: \(service.dial.description)"
            )
        }
        let closed = live.closeLinks(service: service.name) { gatewayID in
            directory.identity(id: gatewayID).map(service.bind.allows) ?? false
        }
        if !cut.isEmpty || closed > 0 {
            logger.notice(
                "policy change enforced",
                metadata: ["service": "\(service.name)", "circuits cut": "\(cut.count)", "links closed": "\(closed)"]
            )
        }
    }

    private func remove(_ name: String) {
        let cut = relay.cut(service: name, keeping: [])
        let closed = live.closeLinks(service: name) { _ in false }
        guard !cut.isEmpty || closed > 0 else { return }
        logger.notice(
            "service deleted: its circuits and links here ended",
            metadata: ["service": "\(name)", "circuits cut": "\(cut.count)", "links closed": "\(closed)"]
        )
    }
}
