import NIOCore
import Testing

@testable import ILSController

/// `CircuitLimiter`: what one identity may hold and open through a controller, counted exactly and refused with the
/// cap that refused it.
@Suite("CircuitLimiter: per-identity circuit caps")
struct CircuitLimiterTests {
    let start = NIODeadline.uptimeNanoseconds(1_000_000_000)

    @Test("an identity holds at most its cap at once; others are not counted against it; a release makes room")
    func concurrentCap() {
        let limiter = CircuitLimiter(limits: .init(concurrent: 3, opensPerSecond: 1000))
        for _ in 0..<3 { #expect(limiter.admit(identityID: "a", now: start) == .admitted) }
        #expect(limiter.admit(identityID: "a", now: start) == .refused(.concurrent))
        #expect(limiter.admit(identityID: "b", now: start) == .admitted)
        limiter.release(identityID: "a", now: start)
        #expect(limiter.open(identityID: "a") == 2)
        #expect(limiter.admit(identityID: "a", now: start) == .admitted)
    }

    @Test("opens are a token bucket: a burst at once, then the sustained rate")
    func rateCap() {
        let limiter = CircuitLimiter(limits: .init(concurrent: 10_000, opensPerSecond: 10, burst: 20))
        var admitted = 0
        var refusedByRate = 0
        for _ in 0..<50 {
            switch limiter.admit(identityID: "a", now: start) {
            case .admitted: admitted += 1
            case .refused(let cap):
                #expect(cap == .rate)
                refusedByRate += 1
            }
        }
        #expect(admitted == 20 && refusedByRate == 30)
        // Half a second later: 5 more tokens.
        let later = start + .milliseconds(500)
        let more = (0..<10).filter { _ in limiter.admit(identityID: "a", now: later) == .admitted }.count
        #expect(more == 5)
    }

    @Test("an idle identity with a full bucket is forgotten")
    func idleIdentitiesAreForgotten() {
        let limiter = CircuitLimiter(limits: .init(concurrent: 5, opensPerSecond: 10, burst: 10))
        #expect(limiter.admit(identityID: "a", now: start) == .admitted)
        limiter.release(identityID: "a", now: start + .seconds(5))
        // Forgotten: a fresh bucket, so the whole burst is there again.
        let burst = (0..<10).filter { _ in limiter.admit(identityID: "a", now: start + .seconds(5)) == .admitted }
        #expect(burst.count == 5)  // the concurrent cap, not the bucket, stops it
        #expect(limiter.open(identityID: "a") == 5)
    }
}
