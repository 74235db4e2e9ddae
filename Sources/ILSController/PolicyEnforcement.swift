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

    func enforce(_ service: ServiceRecord) {
        let grant = controller.dialGrant(for: service)
        let cut = relay.cut(service: service.name, keeping: Set(grant.identities))
        for session in cut {
            controller.state.auditQueue.append(
                actor: "controller",
                action: "circuit.cut",
                target: session.device,
                detail: "the dial policy of '\(service.name)' no longer allows it: \(service.dial.description)"
            )
        }
        live.push(HostControlMessage(dialGrant: grant), service: service.name)
        let directory = controller.state.identities
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
        logger.notice(
            "service deleted: its circuits and links here ended",
            metadata: ["service": "\(name)", "circuits cut": "\(cut.count)", "links closed": "\(closed)"]
        )
    }
}
