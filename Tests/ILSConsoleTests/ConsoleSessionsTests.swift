import ILSCore
import NIOConcurrencyHelpers
import Testing

@testable import ILSConsole

/// The one-time login links and the sessions they open, on a clock the test moves.
struct ConsoleSessionsTests {
    final class Clock: Sendable {
        let now = NIOLockedValueBox(1_000_000.0)
        func advance(_ seconds: Double) { now.withLockedValue { $0 += seconds } }
    }

    private func make(_ clock: Clock, limits: ConsoleSessions.Limits = .init()) -> ConsoleSessions {
        ConsoleSessions(limits: limits, clock: { clock.now.withLockedValue { $0 } })
    }

    @Test func aLoginLinkOpensOneSessionOnly() throws {
        let sessions = make(Clock())
        let secret = sessions.mintLogin()
        let session = try sessions.signIn(with: secret).get()
        #expect(session.id != session.csrf)
        #expect(sessions.session(id: session.id) == session)
        #expect(sessions.signIn(with: secret) == .failure(.used))
        #expect(sessions.sessionCount == 1)
    }

    /// The check a link opened from another site (or a link preview) gets: it says what signing in would say, and
    /// uses nothing.
    @Test func checkingALinkUsesNothing() throws {
        let clock = Clock()
        let sessions = make(clock)
        let secret = sessions.mintLogin()
        #expect(sessions.check(secret) == nil)
        #expect(sessions.check(secret) == nil)
        #expect(sessions.sessionCount == 0)
        _ = try sessions.signIn(with: secret).get()
        #expect(sessions.check(secret) == .used)
        #expect(sessions.check("no-such-secret") == .unknown)
        let late = sessions.mintLogin()
        clock.advance(601)
        #expect(sessions.check(late) == .expired)
    }

    @Test func anUnknownOrAlteredSecretOpensNothing() {
        let sessions = make(Clock())
        let secret = sessions.mintLogin()
        // One character changed (never to itself: a secret ending in "A" gets "B").
        let altered = String(secret.dropLast()) + (secret.hasSuffix("A") ? "B" : "A")
        #expect(sessions.signIn(with: altered) == .failure(.unknown))
        #expect(sessions.signIn(with: "") == .failure(.unknown))
        #expect(sessions.sessionCount == 0)
    }

    @Test func aLoginLinkExpiresAfterTenMinutes() {
        let clock = Clock()
        let sessions = make(clock)
        let secret = sessions.mintLogin()
        clock.advance(601)
        #expect(sessions.signIn(with: secret) == .failure(.expired))
        #expect(sessions.sessionCount == 0)
    }

    @Test func sessionsEndWhenIdleAndAtTheirAbsoluteLimit() throws {
        let clock = Clock()
        let sessions = make(clock)
        let idle = try sessions.signIn(with: sessions.mintLogin()).get()
        clock.advance(1801)
        #expect(sessions.session(id: idle.id) == nil)

        let busy = try sessions.signIn(with: sessions.mintLogin()).get()
        for _ in 0..<28 {  // 11.7 h, each step within the idle timeout
            clock.advance(1500)
            #expect(sessions.session(id: busy.id) != nil)
        }
        clock.advance(1500)  // 12.1 h after sign-in, though seen 25 min ago
        #expect(sessions.session(id: busy.id) == nil)
    }

    @Test func theOldestSessionGivesWayBeyondTheLimit() throws {
        var limits = ConsoleSessions.Limits()
        limits.maximumSessions = 2
        let clock = Clock()
        let sessions = make(clock, limits: limits)
        let first = try sessions.signIn(with: sessions.mintLogin()).get()
        clock.advance(1)
        let second = try sessions.signIn(with: sessions.mintLogin()).get()
        clock.advance(1)
        _ = sessions.session(id: first.id)  // first is now the more recently seen
        let third = try sessions.signIn(with: sessions.mintLogin()).get()
        #expect(sessions.session(id: second.id) == nil)
        #expect(sessions.session(id: first.id) != nil)
        #expect(sessions.session(id: third.id) != nil)
    }

    @Test func outstandingLinksAreBounded() {
        var limits = ConsoleSessions.Limits()
        limits.maximumLoginLinks = 3
        let sessions = make(Clock(), limits: limits)
        let oldest = sessions.mintLogin()
        for _ in 0..<3 { _ = sessions.mintLogin() }
        #expect(sessions.signIn(with: oldest) == .failure(.unknown))
    }

    @Test func signOutEndsTheSession() throws {
        let sessions = make(Clock())
        let session = try sessions.signIn(with: sessions.mintLogin()).get()
        sessions.signOut(id: session.id)
        #expect(sessions.session(id: session.id) == nil)
    }

    @Test func secretsAreLongAndUnique() {
        let tokens = (0..<100).map { _ in ConsoleSessions.randomToken() }
        #expect(Set(tokens).count == 100)
        #expect(
            tokens.allSatisfy { $0.count == 43 && $0.allSatisfy { $0.isLetter || $0.isNumber || "-_".contains($0) } }
        )
        #expect(ConsoleSessions.equal("abc", "abc"))
        #expect(!ConsoleSessions.equal("abc", "abd"))
        #expect(!ConsoleSessions.equal("abc", "abcd"))
    }

    @Test func anAutomaticRefreshDoesNotKeepASessionAlive() throws {
        let clock = Clock()
        let sessions = make(clock)
        let session = try sessions.signIn(with: sessions.mintLogin()).get()
        for _ in 0..<3 {
            clock.advance(500)
            #expect(sessions.session(id: session.id, touch: false) != nil)
        }
        clock.advance(500)
        #expect(sessions.session(id: session.id, touch: false) == nil, "2,000 s without the admin's own request")
    }

    @Test func aNoticeIsShownOnceAndOnlyToItsSession() throws {
        let sessions = make(Clock())
        let mine = try sessions.signIn(with: sessions.mintLogin()).get()
        let other = try sessions.signIn(with: sessions.mintLogin()).get()
        sessions.setNotice("ipad was revoked.", for: mine.id)
        #expect(sessions.takeNotice(for: other.id) == nil)
        #expect(sessions.takeNotice(for: mine.id) == "ipad was revoked.")
        #expect(sessions.takeNotice(for: mine.id) == nil)
        #expect(sessions.takeNotice(for: nil) == nil)
    }
}
