import Foundation
import ILSClient
import ILSCore
import Testing

#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

@Suite("NETWORKING_MODE: which path a request takes, and when HTTP fallback is allowed")
struct NetworkingConfigurationTests {
    let base = URL(string: "https://gateway.example.com")!

    func configuration(_ environment: [String: String]) throws -> NetworkingConfiguration {
        try NetworkingConfiguration(environment: environment)
    }

    @Test("the environment is read: mode, base URL, identity source, fallback")
    func reads() throws {
        let config = try configuration([
            "NETWORKING_MODE": "http", "ILS_HTTP_BASE_URL": "https://gateway.example.com",
            "ILS_IDENTITY_FILE": "/tmp/id.json", "ILS_ALLOW_HTTP_FALLBACK": "true",
        ])
        #expect(
            config
                == NetworkingConfiguration(
                    mode: .http,
                    httpBaseURL: base,
                    identitySource: .file("/tmp/id.json"),
                    allowHTTPFallback: true
                )
        )
        let defaults = try configuration([:])
        #expect(defaults.mode == .ziti)
        #expect(defaults.allowHTTPFallback == false)
        #expect(defaults.httpBaseURL == nil)
        #expect(try configuration(["ILS_IDENTITY_KEYCHAIN": "ipad"]).identitySource == .keychain(account: "ipad"))
    }

    @Test("unknown or contradictory values are refused, not guessed")
    func refusesTypos() {
        for environment in [
            ["NETWORKING_MODE": "zitti"], ["ILS_HTTP_BASE_URL": "gateway.example.com"],
            ["ILS_ALLOW_HTTP_FALLBACK": "maybe"], ["ILS_IDENTITY_FILE": "a", "ILS_IDENTITY_KEYCHAIN": "b"],
        ] {
            #expect(throws: ILSError.self, "\(environment)") { try configuration(environment) }
        }
    }

    @Test("http mode uses HTTP, enrolled or not")
    func httpMode() throws {
        let config = try configuration(["NETWORKING_MODE": "http", "ILS_HTTP_BASE_URL": base.absoluteString])
        #expect(try config.path(enrolled: true) == .http(base))
        #expect(try config.path(enrolled: false) == .http(base))
        #expect(throws: ILSError.self) { try configuration(["NETWORKING_MODE": "http"]).path(enrolled: false) }
    }

    @Test("ziti mode: a device with no identity uses HTTP; with one, the overlay")
    func zitiMode() throws {
        let config = try configuration(["NETWORKING_MODE": "ziti", "ILS_HTTP_BASE_URL": base.absoluteString])
        #expect(try config.path(enrolled: false) == .http(base))
        #expect(try config.path(enrolled: true) == .overlay)
        #expect(try configuration(["NETWORKING_MODE": "ziti"]).path(enrolled: true) == .overlay)
        #expect(throws: ILSError.self) { try configuration(["NETWORKING_MODE": "ziti"]).path(enrolled: false) }
    }

    @Test("an enrolled device never falls back to HTTP when the overlay is down, unless allowed")
    func noSilentDowngrade() throws {
        let down = OverlayURLError.make(code: "controller_unreachable", reason: "down", url: nil)
        let config = try configuration(["ILS_HTTP_BASE_URL": base.absoluteString])
        #expect(throws: URLError.self) { try config.pathAfterOverlayFailure(down) }
        let allowing = try configuration(["ILS_HTTP_BASE_URL": base.absoluteString, "ILS_ALLOW_HTTP_FALLBACK": "1"])
        #expect(try allowing.pathAfterOverlayFailure(down) == .http(base))
        let unavailable = OverlayURLError.make(code: "service_unavailable", reason: "no gateway", url: nil)
        #expect(try allowing.pathAfterOverlayFailure(unavailable) == .http(base))
        // Allowed, but with nowhere to go: the overlay's error.
        let nowhere = try configuration(["ILS_ALLOW_HTTP_FALLBACK": "1"])
        #expect(throws: URLError.self) { try nowhere.pathAfterOverlayFailure(down) }
    }

    @Test("a refusal is never a reason to fall back, even when fallback is allowed")
    func refusalsDoNotFallBack() throws {
        let allowing = try configuration(["ILS_HTTP_BASE_URL": base.absoluteString, "ILS_ALLOW_HTTP_FALLBACK": "yes"])
        for code in ["identity_blocked", "dial_denied", "unknown_service", "truncated", "gateway_denied"] {
            let refused = OverlayURLError.make(code: code, reason: "no", url: nil)
            #expect(throws: URLError.self, "\(code)") { try allowing.pathAfterOverlayFailure(refused) }
        }
        #expect(throws: URLError.self) { try allowing.pathAfterOverlayFailure(URLError(.timedOut)) }
    }

    @Test("the identity source names its store; the file store is the default off Apple platforms")
    func stores() throws {
        #expect(try configuration(["ILS_IDENTITY_FILE": "/tmp/x.json"]).identityStore() is FileIdentityStore)
        #if !canImport(Security)
        #expect(NetworkingConfiguration.defaultIdentitySource == .file("identity.json"))
        #expect(throws: ILSError.self) { try configuration(["ILS_IDENTITY_KEYCHAIN": "a"]).identityStore() }
        #endif
    }
}
