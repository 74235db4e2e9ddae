import Foundation
import ILSCore
import Testing

@Suite("Service policies: roles, attributes and identities, any or all")
struct ServicePolicyTests {
    private static let ids = ["alice": "id-alice", "bob": "id-bob"]

    private static func parse(_ semantic: ServicePolicy.Semantic, _ texts: [String]) throws(ILSError) -> ServicePolicy {
        var tokens: [ServicePolicy.Token] = []
        for text in texts {
            tokens.append(try ServicePolicy.Token(parsing: text, resolve: { name throws(ILSError) in ids[name] }))
        }
        return try ServicePolicy(semantic, tokens)
    }

    @Test("anyOf allows an identity matching one token; allOf only one matching every token")
    func semantics() throws {
        let any = try Self.parse(.anyOf, ["role:device", "#ipad", "@bob"])
        #expect(any.allows(id: "id-x", role: .device, attributes: []))
        #expect(any.allows(id: "id-x", role: .gateway, attributes: ["ipad"]))
        #expect(any.allows(id: "id-bob", role: .admin, attributes: []))
        #expect(!any.allows(id: "id-x", role: .gateway, attributes: ["mac"]))

        let all = try Self.parse(.allOf, ["role:device", "#ipad", "#work"])
        #expect(all.allows(id: "id-x", role: .device, attributes: ["work", "ipad"]))
        #expect(!all.allows(id: "id-x", role: .device, attributes: ["ipad"]))
        #expect(!all.allows(id: "id-x", role: .admin, attributes: ["ipad", "work"]))
    }

    @Test("an empty policy allows nobody, under either semantic; #all allows everyone")
    func emptyAndAll() throws {
        for semantic in [ServicePolicy.Semantic.anyOf, .allOf] {
            let empty = try ServicePolicy(semantic, [])
            #expect(!empty.allows(id: "id-x", role: .admin, attributes: ["ipad"]))
        }
        let everyone = try Self.parse(.anyOf, ["#all"])
        for role in IdentityRole.allCases { #expect(everyone.allows(id: "id-x", role: role, attributes: [])) }
    }

    @Test("@NAME is resolved to the identity's id when written: a namesake made later is not allowed")
    func identitiesAreIDs() throws {
        let policy = try Self.parse(.anyOf, ["@alice"])
        #expect(policy.tokens == [.identity(id: "id-alice")])
        #expect(policy.allows(id: "id-alice", role: .device, attributes: []))
        #expect(!policy.allows(id: "id-alice-2", role: .device, attributes: []))
        #expect(throws: ILSError.self) { try Self.parse(.anyOf, ["@carol"]) }
    }

    @Test("what could never be meant is refused: unknown forms, bad names, #all beside others, impossible allOf")
    func refusals() {
        let refused: [(ServicePolicy.Semantic, [String])] = [
            (.anyOf, ["device"]),
            (.anyOf, ["role:root"]),
            (.anyOf, ["#"]),
            (.anyOf, ["#../etc"]),
            (.anyOf, ["#ipad\u{1b}[2J"]),
            (.anyOf, ["@id:"]),
            (.anyOf, ["#all", "role:device"]),
            (.allOf, ["role:device", "role:admin"]),
            (.allOf, ["@alice", "@bob"]),
            (.anyOf, [String(repeating: "a", count: 71)]),
            (.anyOf, (0..<33).map { "#a\($0)" }),
        ]
        for (semantic, texts) in refused {
            #expect(throws: ILSError.self, "\(semantic) \(texts.prefix(3))") { try Self.parse(semantic, texts) }
        }
    }

    @Test("duplicates are dropped, order kept")
    func duplicates() throws {
        let policy = try Self.parse(.anyOf, ["#ipad", "role:device", "#ipad"])
        #expect(policy.tokens == [.attribute("ipad"), .role(.device)])
    }

    @Test("JSON round trip; a decoded policy is validated again, and a bare @NAME is refused there")
    func json() throws {
        let policy = try Self.parse(.allOf, ["role:device", "#ipad", "@alice"])
        let data = try JSONEncoder().encode(policy)
        let text = String(decoding: data, as: UTF8.self)
        #expect(text.contains("\"@id:id-alice\""))
        #expect(try JSONDecoder().decode(ServicePolicy.self, from: data) == policy)
        for bad in [
            #"{"semantic":"anyOf","tokens":["@alice"]}"#,
            #"{"semantic":"allOf","tokens":["role:device","role:admin"]}"#,
            #"{"semantic":"someOf","tokens":[]}"#,
        ] {
            #expect(throws: (any Error).self, "\(bad)") {
                try JSONDecoder().decode(ServicePolicy.self, from: Data(bad.utf8))
            }
        }
    }

    @Test("earlier releases, which know roles only, are told a subset of who may dial, never more")
    func legacyRoles() throws {
        #expect(ServicePolicy.roles([.device]).legacyRoles == [.device])
        #expect(try Self.parse(.anyOf, ["role:device", "#ipad"]).legacyRoles == [.device])
        #expect(try Self.parse(.anyOf, ["#ipad"]).legacyRoles.isEmpty)
        #expect(try Self.parse(.allOf, ["role:device", "#ipad"]).legacyRoles.isEmpty)
        #expect(try Self.parse(.allOf, ["role:device"]).legacyRoles == [.device])
        #expect(try Self.parse(.anyOf, ["#all"]).legacyRoles == IdentityRole.allCases)
    }
}
