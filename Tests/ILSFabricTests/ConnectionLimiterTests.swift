import ILSFabric
import NIOCore
import Testing

@Suite("Connection caps: per source address and in total")
struct ConnectionLimiterTests {
    @Test("a source is refused beyond its cap while another source is still admitted; a release frees a slot")
    func perSourceCap() {
        let limiter = ConnectionLimiter(limits: .init(total: 100, perSource: 2))
        #expect(limiter.admit(source: "10.0.0.1") == .admitted)
        #expect(limiter.admit(source: "10.0.0.1") == .admitted)
        guard case .refused(let refusal) = limiter.admit(source: "10.0.0.1") else {
            Issue.record("the third connection from one source was admitted")
            return
        }
        #expect(refusal.cap == .perSource && refusal.source == "10.0.0.1")
        #expect(limiter.admit(source: "10.0.0.2") == .admitted)
        #expect(limiter.openConnections == 3)
        limiter.release(source: "10.0.0.1")
        #expect(limiter.admit(source: "10.0.0.1") == .admitted)
        #expect(limiter.openConnections == 3)
    }

    @Test("beyond the total every source is refused, until a connection closes")
    func totalCap() {
        let limiter = ConnectionLimiter(limits: .init(total: 3, perSource: 10))
        for source in ["a", "b", "c"] { #expect(limiter.admit(source: source) == .admitted) }
        guard case .refused(let refusal) = limiter.admit(source: "d") else {
            Issue.record("a connection beyond the total was admitted")
            return
        }
        #expect(refusal.cap == .total)
        limiter.release(source: "b")
        #expect(limiter.admit(source: "d") == .admitted)
        #expect(limiter.openConnections == 3)
    }

    @Test("releasing every connection leaves nothing counted, and a release of an unknown source changes nothing")
    func releaseBalances() {
        let limiter = ConnectionLimiter(limits: .init(total: 10, perSource: 10))
        for _ in 0..<5 { _ = limiter.admit(source: "a") }
        for _ in 0..<5 { limiter.release(source: "a") }
        limiter.release(source: "never-admitted")
        #expect(limiter.openConnections == 0)
        for _ in 0..<10 { #expect(limiter.admit(source: "a") == .admitted) }
    }

    @Test("a flood from one source gets one log line per interval, which says how many refusals went unlogged")
    func refusalsAreLoggedOncePerSourcePerInterval() {
        let limiter = ConnectionLimiter(limits: .init(total: 100, perSource: 1), logInterval: .seconds(60))
        let start = NIODeadline.uptimeNanoseconds(1_000_000_000)
        _ = limiter.admit(source: "a", now: start)
        var logged: [ConnectionLimiter.Refusal] = []
        for second in 0..<150 {
            if case .refused(let refusal) = limiter.admit(source: "a", now: start + .seconds(Int64(second))),
                refusal.logged
            {
                logged.append(refusal)
            }
        }
        // Seconds 0, 60 and 120 log; each later line counts the 59 refusals since the one before.
        #expect(logged.map(\.unlogged) == [0, 59, 59])
        // Another source has its own interval: its first refusal is logged even inside the first one's.
        #expect(limiter.admit(source: "b", now: start + .seconds(1)) == .admitted)
        guard case .refused(let other) = limiter.admit(source: "b", now: start + .seconds(2)) else {
            Issue.record("the second connection from b was admitted")
            return
        }
        #expect(other.logged)
    }
}
