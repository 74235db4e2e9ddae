import ILSCore
import Testing

/// Issue 40, one route table: every controller API route is declared once in `ControllerEndpoint`, and the
/// controller's router and `ControllerClient` both use it, so a path a client builds is the path the router matches.
@Suite("The controller API's route table")
struct ControllerRoutesTests {
    @Test("every route's path, built as a client builds it, matches back to that route and its name")
    func pathsMatchBack() {
        for endpoint in ControllerEndpoint.allCases {
            let name = endpoint.template.contains("{name}") ? "ipad-2" : nil
            let matched = ControllerEndpoint.match(method: endpoint.method, path: endpoint.path(name: name))
            #expect(matched?.endpoint == endpoint, "\(endpoint)")
            #expect(matched?.name == name, "\(endpoint)")
        }
    }

    @Test("no two routes share a method and a path; the admin API is what starts with /v1/admin")
    func routesAreDistinct() {
        let keys = ControllerEndpoint.allCases.map { "\($0.method) \($0.template)" }
        #expect(Set(keys).count == keys.count, "\(keys)")
        #expect(ControllerEndpoint.allCases.filter(\.isAdmin).count == 17)
        #expect(!ControllerEndpoint.enroll.isAdmin && ControllerEndpoint.revokeIdentity.isAdmin)
    }

    @Test("the router's matching: empty segments ignored; a wrong method, a longer path or an unknown one is no route")
    func matching() {
        #expect(ControllerEndpoint.match(method: "GET", path: "//v1//health/")?.endpoint == .health)
        #expect(ControllerEndpoint.match(method: "POST", path: "/v1/health") == nil)
        #expect(ControllerEndpoint.match(method: "GET", path: "/v1/health/more") == nil)
        #expect(ControllerEndpoint.match(method: "GET", path: "/v1/admin/nothing") == nil)
        #expect(ControllerEndpoint.match(method: "DELETE", path: "/v1/admin/services/api")?.endpoint == .deleteService)
    }

    @Test("a name or query value cannot reach another route: everything but unreserved characters is encoded")
    func namesAreEncoded() {
        let path = ControllerEndpoint.identity.path(name: "a/revoke?x=1")
        #expect(path == "/v1/admin/identities/a%2Frevoke%3Fx%3D1")
        #expect(ControllerEndpoint.match(method: "GET", path: path)?.endpoint == .identity)
        #expect(ControllerEndpoint.match(method: "POST", path: path) == nil, "not the revoke route")
        let audit = ControllerEndpoint.audit.path(query: [("limit", "5"), ("actor", "a b&c")])
        #expect(audit == "/v1/admin/audit?limit=5&actor=a%20b%26c")
    }
}
