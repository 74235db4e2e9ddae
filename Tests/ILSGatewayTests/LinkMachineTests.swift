import ILSFabric
import NIOCore
import Testing

@testable import ILSGateway

/// Every transition of a gateway link's lifecycle, without a channel (`deploy/check-machine-mutations.py` removes
/// each and checks that a test here fails).
@Suite("A gateway link's lifecycle (LinkMachine)")
struct LinkMachineTests {
    /// Holds a machine, so that `#expect` (which captures what it checks) can drive it.
    final class Driven {
        var machine = LinkMachine()

        /// Runs `event` on the machine: `link { $0.dial(certificate: "old") }`.
        func callAsFunction<Result>(_ event: (inout LinkMachine) -> Result) -> Result { event(&machine) }
    }

    /// Stands for a connection: only its identity matters.
    final class Connection {
        var id: ObjectIdentifier { ObjectIdentifier(self) }
    }

    let first = Connection()
    let second = Connection()

    /// A machine whose link is connected on `first` with certificate "old", not answered yet.
    func connected() -> Driven {
        let link = Driven()
        #expect(link { $0.dial(certificate: "old") })
        #expect(link { $0.connected(first.id) } == .keep)
        return link
    }

    func wait(_ next: LinkMachine.Next) -> TimeAmount? {
        guard case .dial(let wait, _) = next else { return nil }
        return wait
    }

    func ending(_ next: LinkMachine.Next) -> LinkMachine.Ending? {
        guard case .dial(_, let because) = next else { return nil }
        return because
    }

    @Test("dialled, connected, accepted: bound on the relay loop the controller named, with the dialled certificate")
    func bindsAfterConnecting() {
        let link = connected()
        #expect(link.machine.link?.binding == .awaiting)
        #expect(link.machine.bound == nil)
        #expect(link { $0.accepted(first.id, relayLoop: 3, relayLoops: 4) } == .bound)
        #expect(link.machine.bound?.connection == first.id)
        #expect(link.machine.bound?.certificate == "old")
        #expect(link.machine.bound?.relayLoop == 3)
        // A policy message that repeats the acceptance changes nothing.
        #expect(link { $0.accepted(first.id) } == .bound)
        #expect(link.machine.bound?.relayLoop == 3)
    }

    @Test("the controller's answer that comes before the dial has returned is kept, not reset by the connect")
    func answerBeforeConnect() {
        let link = Driven()
        #expect(link { $0.dial(certificate: "old") })
        #expect(link.machine.accepts(first.id))
        #expect(link { $0.accepted(first.id) } == .bound)
        #expect(link { $0.connected(first.id) } == .keep)
        #expect(link.machine.bound?.connection == first.id)
        #expect(link.machine.bound?.relayLoop == 0)
    }

    @Test("an answer taken for the dial's that came on another connection does not bind the one the dial made")
    func answerOfAnotherConnection() {
        let link = Driven()
        #expect(link { $0.dial(certificate: "old") })
        #expect(link { $0.accepted(second.id) } == .bound)
        #expect(link { $0.connected(first.id) } == .keep)
        #expect(link.machine.link == .init(connection: first.id, certificate: "old", binding: .awaiting))
        #expect(link.machine.accepts(first.id))
        #expect(!link.machine.accepts(second.id))
    }

    @Test("answers and refusals of a connection that is not the link's change nothing")
    func staleAnswers() {
        let link = connected()
        #expect(link { $0.accepted(second.id) } == .stale)
        #expect(!link { $0.refused(second.id, reason: "no", code: nil) })
        #expect(link.machine.link?.binding == .awaiting)
        #expect(link { $0.refused(first.id, reason: "not allowed", code: "service_refused") })
        #expect(link.machine.link?.binding == .refused(reason: "not allowed", code: "service_refused"))
        // Once refused, a late acceptance does not bind it.
        #expect(link { $0.accepted(first.id) } == .stale)
        #expect(link.machine.bound == nil)
        let idle = Driven()
        #expect(!idle.machine.accepts(first.id))
        #expect(idle { $0.accepted(first.id) } == .stale)
        #expect(!idle { $0.refused(first.id, reason: "no", code: nil) })
        #expect(idle.machine.state == .idle)
    }

    @Test("a refusal that comes before the dial has returned is kept")
    func refusalBeforeConnect() {
        let link = Driven()
        #expect(link { $0.dial(certificate: "old") })
        #expect(link { $0.refused(first.id, reason: "blocked", code: HostControlMessage.identityBlocked) })
        #expect(link { $0.connected(first.id) } == .keep)
        #expect(link.machine.link?.binding == .refused(reason: "blocked", code: HostControlMessage.identityBlocked))
    }

    @Test("a link lost after it was bound: dial again after the first step of the backoff, which binding reset")
    func lostAfterBound() throws {
        let link = Driven()
        // Failed dials make the backoff grow...
        for _ in 0..<4 {
            #expect(link { $0.dial(certificate: "old") })
            #expect(ending(link { $0.dialFailed() }) == .failed)
        }
        #expect(link { $0.dial(certificate: "old") })
        let grown = try #require(wait(link { $0.dialFailed() }))
        #expect(grown >= .milliseconds(400), "\(grown)")
        #expect(link.machine.state == .idle)
        // ...and a binding starts it over.
        #expect(link { $0.dial(certificate: "old") })
        #expect(link { $0.connected(first.id) } == .keep)
        #expect(link { $0.accepted(first.id) } == .bound)
        let next = link { $0.ended(first.id) }
        #expect(ending(next) == .lost(wasBound: true))
        #expect(try #require(wait(next)) <= .milliseconds(100))
        #expect(link.machine.state == .idle)
        #expect(link.machine.link == nil)
    }

    @Test("a link that closes before the controller answered: lost, not bound, and the backoff goes on growing")
    func lostUnanswered() throws {
        let link = Driven()
        var waits: [TimeAmount] = []
        for _ in 0..<5 {
            #expect(link { $0.dial(certificate: "old") })
            #expect(link { $0.connected(first.id) } == .keep)
            let next = link { $0.ended(first.id) }
            #expect(ending(next) == .lost(wasBound: false))
            waits.append(try #require(wait(next)))
        }
        #expect(waits.first! <= .milliseconds(100))
        #expect(waits.last! >= .milliseconds(400), "\(waits)")
    }

    @Test("a refused link waits as its refusal says: the identity's for minutes, the service's for seconds")
    func refusedWaits() throws {
        let link = connected()
        #expect(link { $0.refused(first.id, reason: "blocked", code: HostControlMessage.identityBlocked) })
        let identity = link { $0.ended(first.id) }
        #expect(ending(identity) == .refused(code: HostControlMessage.identityBlocked))
        #expect(try #require(wait(identity)) >= .seconds(15))
        #expect(link { $0.dial(certificate: "old") })
        #expect(link { $0.connected(second.id) } == .keep)
        #expect(link { $0.refused(second.id, reason: "not hosted", code: "unknown_service") })
        let service = link { $0.ended(second.id) }
        #expect(ending(service) == .refused(code: "unknown_service"))
        let serviceWait = try #require(wait(service))
        #expect(serviceWait >= .milliseconds(2500) && serviceWait <= .seconds(5), "\(serviceWait)")
    }

    @Test("a renewal replaces the link in use: it is handed back to drain, and the next dial is at once")
    func rotation() throws {
        let link = connected()
        #expect(link { $0.accepted(first.id) } == .bound)
        #expect(link { $0.rotate() } == first.id)
        #expect(link.machine.state == .idle)
        #expect(link.machine.bound == nil)
        #expect(!link.machine.accepts(first.id))
        #expect(link { $0.ended(first.id) } == .dial(after: .zero, because: .rotated))
        #expect(link { $0.dial(certificate: "new") })
        #expect(link { $0.connected(second.id) } == .keep)
        #expect(link { $0.accepted(second.id) } == .bound)
        #expect(link.machine.bound?.certificate == "new")
        // Nothing to replace while idle.machine.
        let idle = Driven()
        #expect(idle { $0.rotate() } == nil)
        #expect(idle.machine.state == .idle)
    }

    @Test("a renewal during a dial replaces the connection that dial makes: it never answers for the link")
    func rotationWhileDialling() {
        let link = Driven()
        #expect(link { $0.dial(certificate: "old") })
        #expect(link { $0.rotate() } == nil)
        #expect(link.machine.state == .dialling(certificate: "old", stale: true))
        #expect(!link.machine.accepts(first.id))
        #expect(link { $0.accepted(first.id) } == .stale)
        #expect(link { $0.connected(first.id) } == .replace)
        #expect(link.machine.state == .idle)
        #expect(link { $0.dial(certificate: "new") })
        #expect(link.machine.state == .dialling(certificate: "new", stale: false))
    }

    @Test(
        "a link on a relay loop another link has is a duplicate: dialled again at once a few times, then with backoff"
    )
    func duplicates() throws {
        let link = Driven()
        let quickTries = LinkMachine.quickRetriesPerLoop * 2
        var endings: [LinkMachine.Ending] = []
        for _ in 0...quickTries {
            #expect(link { $0.dial(certificate: "old") })
            #expect(link { $0.connected(first.id) } == .keep)
            #expect(link { $0.accepted(first.id, relayLoop: 1, loopTaken: true, relayLoops: 2) } == .duplicate)
            #expect(link.machine.link?.binding == .duplicate)
            #expect(link.machine.bound == nil)
            let next = link { $0.ended(first.id) }
            endings.append(try #require(ending(next)))
            if ending(next) == .duplicate(quick: true) {
                #expect(try #require(wait(next)) <= .milliseconds(50))
            }
        }
        #expect(endings.dropLast().allSatisfy { $0 == .duplicate(quick: true) }, "\(endings)")
        #expect(endings.last == .duplicate(quick: false))
        // A link that lands on a loop of its own starts the count over.
        #expect(link { $0.dial(certificate: "old") })
        #expect(link { $0.connected(first.id) } == .keep)
        #expect(link { $0.accepted(first.id, relayLoop: 0, relayLoops: 2) } == .bound)
        _ = link { $0.ended(first.id) }
        #expect(link { $0.dial(certificate: "old") })
        #expect(link { $0.connected(first.id) } == .keep)
        #expect(link { $0.accepted(first.id, relayLoop: 1, loopTaken: true, relayLoops: 2) } == .duplicate)
        #expect(ending(link { $0.ended(first.id) }) == .duplicate(quick: true))
    }

    @Test("stop: the connection in use is handed back to close; nothing dials or connects after it")
    func stop() {
        let link = connected()
        #expect(link { $0.stop() } == first.id)
        #expect(link.machine.isStopped)
        #expect(link { $0.ended(first.id) } == .stop)
        #expect(!link { $0.dial(certificate: "old") })
        #expect(link { $0.connected(second.id) } == .close)
        #expect(link { $0.dialFailed() } == .stop)
        #expect(link { $0.rotate() } == nil)
        #expect(link.machine.isStopped)
        let dialling = Driven()
        #expect(dialling { $0.dial(certificate: "old") })
        #expect(dialling { $0.stop() } == nil)
        #expect(dialling { $0.connected(first.id) } == .close)
        #expect(!dialling.machine.accepts(first.id))
    }
}
