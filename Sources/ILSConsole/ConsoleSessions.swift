public import Foundation
import NIOConcurrencyHelpers

/// One-time login secrets and the signed-in browser sessions, in memory only: a restart signs everyone out, and
/// nothing secret is ever written to disk. Every secret is 32 random bytes from the system's CSPRNG, base64url, and
/// compared in constant time.
public final class ConsoleSessions: Sendable {
    /// A signed-in browser: its cookie value is `id`; its forms carry `csrf`.
    public struct Session: Sendable, Equatable {
        public let id: String
        public let csrf: String
        let created: Double
        var lastSeen: Double
    }

    /// How a login secret was refused: the page says which.
    public enum LoginRefusal: Error, Equatable {
        case used, expired, unknown
    }

    public struct Limits: Sendable {
        public var loginLifetime: Double = 600
        public var idleTimeout: Double = 1800
        public var absoluteLifetime: Double = 12 * 3600
        /// The most sessions held at once; signing in beyond it ends the least recently seen one.
        public var maximumSessions = 16
        /// The most login links outstanding at once; minting beyond it drops the oldest.
        public var maximumLoginLinks = 8

        public init() {}
    }

    private struct State {
        var logins: [(secret: String, expires: Double)] = []
        /// Secrets already used, kept until they would have expired, so a second use says "used".
        var usedLogins: [(secret: String, expires: Double)] = []
        var sessions: [Session] = []
        /// What the next page of a session says about the change it just made (post/redirect/get), kept here so a
        /// link cannot put words on a page.
        var notices: [String: String] = [:]
    }

    private let state = NIOLockedValueBox(State())
    private let limits: Limits
    private let clock: @Sendable () -> Double

    public init(limits: Limits = Limits(), clock: @escaping @Sendable () -> Double = { Date().timeIntervalSince1970 }) {
        self.limits = limits
        self.clock = clock
    }

    /// A new one-time login secret, valid for `limits.loginLifetime`.
    public func mintLogin() -> String {
        let secret = Self.randomToken()
        let now = clock()
        state.withLockedValue { state in
            state.logins.removeAll { $0.expires <= now }
            state.logins.append((secret, now + limits.loginLifetime))
            if state.logins.count > limits.maximumLoginLinks { state.logins.removeFirst() }
        }
        return secret
    }

    /// Why `secret` would be refused, or `nil` when it would open a session; consumes nothing (a link opened from
    /// another site, or fetched by a chat app's link preview, is only shown a button until a person presses it).
    public func check(_ secret: String) -> LoginRefusal? {
        let now = clock()
        return state.withLockedValue { state in
            if state.usedLogins.contains(where: { Self.equal($0.secret, secret) && $0.expires > now }) { return .used }
            guard let login = state.logins.first(where: { Self.equal($0.secret, secret) }) else { return .unknown }
            return login.expires > now ? nil : .expired
        }
    }

    /// Consumes `secret` and opens a session, or says why not. Whatever the outcome, the secret cannot open a second.
    public func signIn(with secret: String) -> Result<Session, LoginRefusal> {
        let now = clock()
        return state.withLockedValue { state in
            state.usedLogins.removeAll { $0.expires <= now }
            if state.usedLogins.contains(where: { Self.equal($0.secret, secret) }) { return .failure(.used) }
            guard let index = state.logins.firstIndex(where: { Self.equal($0.secret, secret) }) else {
                return .failure(.unknown)
            }
            let login = state.logins.remove(at: index)
            state.usedLogins.append(login)
            guard login.expires > now else { return .failure(.expired) }
            state.sessions.removeAll { !isLive($0, now: now) }
            if state.sessions.count >= limits.maximumSessions,
                let oldest = state.sessions.indices.min(by: {
                    state.sessions[$0].lastSeen < state.sessions[$1].lastSeen
                })
            {
                state.sessions.remove(at: oldest)
            }
            let session = Session(id: Self.randomToken(), csrf: Self.randomToken(), created: now, lastSeen: now)
            state.sessions.append(session)
            return .success(session)
        }
    }

    /// The live session whose cookie value is `id`, marked as seen now unless `touch` is false (a page's own
    /// automatic refresh, which must not keep an unattended browser signed in).
    public func session(id: String, touch: Bool = true) -> Session? {
        let now = clock()
        return state.withLockedValue { state in
            guard let index = state.sessions.firstIndex(where: { Self.equal($0.id, id) }) else { return nil }
            guard isLive(state.sessions[index], now: now) else {
                state.sessions.remove(at: index)
                return nil
            }
            if touch { state.sessions[index].lastSeen = now }
            return state.sessions[index]
        }
    }

    public func signOut(id: String) {
        state.withLockedValue { state in
            state.sessions.removeAll { Self.equal($0.id, id) }
            state.notices[id] = nil
        }
    }

    /// Keeps `text` for the next page `id`'s session loads.
    public func setNotice(_ text: String, for id: String) {
        state.withLockedValue { state in
            state.notices = state.notices.filter { entry in state.sessions.contains { $0.id == entry.key } }
            state.notices[id] = text
        }
    }

    /// The notice kept for `id`'s session, once.
    public func takeNotice(for id: String?) -> String? {
        guard let id else { return nil }
        return state.withLockedValue { state in state.notices.removeValue(forKey: id) }
    }

    public var sessionCount: Int { state.withLockedValue { $0.sessions.count } }

    private func isLive(_ session: Session, now: Double) -> Bool {
        now - session.lastSeen < limits.idleTimeout && now - session.created < limits.absoluteLifetime
    }

    /// 32 bytes of `SystemRandomNumberGenerator` (getrandom(2) on Linux, arc4random on Apple platforms), base64url.
    static func randomToken() -> String {
        var generator = SystemRandomNumberGenerator()
        let bytes = (0..<32).map { _ in UInt8.random(in: 0...255, using: &generator) }
        return Data(bytes).base64EncodedString().replacingOccurrences(of: "+", with: "-")
            .replacingOccurrences(of: "/", with: "_").replacingOccurrences(of: "=", with: "")
    }

    /// Compares in time that depends only on the lengths, so a guess learns nothing from how long a refusal took.
    public static func equal(_ a: String, _ b: String) -> Bool {
        let x = Array(a.utf8)
        let y = Array(b.utf8)
        guard x.count == y.count else { return false }
        var difference: UInt8 = 0
        for index in x.indices { difference |= x[index] ^ y[index] }
        return difference == 0
    }
}
