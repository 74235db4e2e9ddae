import ILSCore
import Testing

@testable import ILSController

@Suite("The controller list clients are told to keep")
struct ControllerRosterTests {
    @Test(
        "nothing before the store was read; a controller alone only after the heartbeat window; a cluster at once"
    )
    func announced() throws {
        let own = try ControllerAddress(parsing: "https://a:8443")
        let roster = ControllerRoster(own: own, soloAnnounceAfter: .seconds(3600))
        #expect(roster.announced == nil, "announced before the store was read")
        _ = roster.record([own.description])
        // The first controller back after a cluster-wide outage finds itself alone: it must not tell clients so.
        #expect(roster.announced == nil)
        #expect(roster.record([own.description, "https://b:8443"]))
        #expect(roster.announced == [own.description, "https://b:8443"])
        #expect(!roster.record(["https://b:8443", own.description]), "the same set in another order is no change")

        let alone = ControllerRoster(own: own, soloAnnounceAfter: .zero)
        _ = alone.record([own.description])
        #expect(alone.announced == [own.description])
    }
}
