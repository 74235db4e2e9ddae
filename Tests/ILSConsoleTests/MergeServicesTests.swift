import ILSAdmin
import ILSCore
import Testing

/// What `admin service list` and the console's Services and Gateways pages show of a cluster: each controller knows
/// only the gateways linked to it, and a replica may not have heard of the latest change yet.
struct MergeServicesTests {
    private func info(_ name: String, _ dial: String, revision: Int64, hosts: [String], at controller: String)
        -> ControllerAPI.ServiceInfo
    {
        ControllerAPI.ServiceInfo(
            name: name,
            dial: .init(semantic: .anyOf, tokens: [dial]),
            bind: .init(semantic: .anyOf, tokens: ["role:gateway"]),
            revision: revision,
            hosts: hosts.map { .init(gateway: $0, links: 2, controller: controller) }
        )
    }

    @Test func theNewestPoliciesWithEveryControllersHosts() {
        let a = [
            info("claude-api", "#ipad", revision: 3, hosts: ["gw-1"], at: "a"),
            info("second-api", "role:device", revision: 1, hosts: [], at: "a"),
        ]
        let b = [info("claude-api", "role:device", revision: 2, hosts: ["gw-2"], at: "b")]
        let c = [info("claude-api", "role:device", revision: 2, hosts: ["gw-3"], at: "c")]
        for order in [[a, b, c], [b, a, c], [c, b, a]] {
            let merged = ClusterCalls.mergeServices(order)
            #expect(merged.map(\.name) == ["claude-api", "second-api"])
            #expect(merged[0].revision == 3 && merged[0].dial.tokens == ["#ipad"], "a stale replica's policy shown")
            #expect(Set(merged[0].hosts.map(\.gateway)) == ["gw-1", "gw-2", "gw-3"])
            #expect(merged[0].hosts.count == 3)
            #expect(merged[1].hosts.isEmpty)
        }
    }
}
