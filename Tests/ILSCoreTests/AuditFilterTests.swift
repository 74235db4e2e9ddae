import ILSCore
import Testing

struct AuditFilterTests {
    @Test func anActionEndingInADotIsAFamily() throws {
        let family = try ControllerAPI.AuditFilter(query: ["action": "identity.", "actor": "ops"])
        #expect(family.actionPrefix == "identity." && family.exactAction == nil && family.actor == "ops")
        let exact = try ControllerAPI.AuditFilter(query: ["action": "identity.revoke", "target": "ipad"])
        #expect(exact.exactAction == "identity.revoke" && exact.actionPrefix == nil && exact.target == "ipad")
        #expect(try ControllerAPI.AuditFilter(query: ["since": "5"]) == ControllerAPI.AuditFilter())
    }

    @Test func emptyOverLongAndControlValuesAreRefused() {
        for query in [
            ["actor": ""], ["target": String(repeating: "a", count: 129)], ["action": "identity.\u{1B}[2J"],
            ["target": "ipad\n"],
        ] {
            let error = #expect(throws: ILSError.self) { try ControllerAPI.AuditFilter(query: query) }
            #expect(error?.code == .invalidArgument)
            #expect(error?.reason.contains("\u{1B}") == false, "the refusal never echoes the value")
        }
    }

    @Test func theQueryIsPercentEncoded() {
        let filter = ControllerAPI.AuditFilter(actor: "a b&c", action: "identity.", target: "ipad_2~é")
        #expect(filter.queryParameters == "&actor=a%20b%26c&action=identity.&target=ipad_2~%C3%A9")
        #expect(ControllerAPI.AuditFilter().queryParameters == "")
    }
}
