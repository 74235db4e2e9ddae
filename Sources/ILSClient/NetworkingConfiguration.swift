public import Foundation
public import ILSCore

/// How an app reaches its backend: through the overlay (`ziti`) or over plain HTTPS to an HTTP-mode gateway
/// (`http`), read from the app's settings or environment (`NETWORKING_MODE`, `ILS_HTTP_BASE_URL`,
/// `ILS_IDENTITY_FILE` or `ILS_IDENTITY_KEYCHAIN`, `ILS_ALLOW_HTTP_FALLBACK`).
///
/// The rule (`path(enrolled:)`, `pathAfterOverlayFailure(_:)`):
/// - `http` mode uses HTTP;
/// - `ziti` mode with no identity stored uses HTTP: a device that is not enrolled yet still works;
/// - `ziti` mode with an identity uses the overlay, and never falls back to HTTP on its own when the overlay is
///   down: that would be a downgrade an attacker could force by blocking the controller. The app gets the
///   overlay's error, unless `allowHTTPFallback` is set, and then only for the overlay being unreachable
///   (`controller_unreachable`, `service_unavailable`), never for a refusal such as `identity_blocked`.
public struct NetworkingConfiguration: Sendable, Equatable {
    /// The two networking modes, named as the app's `NETWORKING_MODE` names them.
    public enum Mode: String, Sendable, Equatable {
        case ziti
        case http
    }

    /// Where the device's identity is kept.
    public enum IdentitySource: Sendable, Equatable {
        /// A 0600 JSON file (`FileIdentityStore`).
        case file(String)
        /// A Keychain item (`KeychainIdentityStore`; Apple platforms only).
        case keychain(account: String)
    }

    /// The path a request takes.
    public enum Path: Sendable, Equatable {
        case overlay
        case http(URL)
    }

    public var mode: Mode
    /// The HTTP-mode gateway, e.g. `https://gateway.example.com`; needed for HTTP mode and for fallback.
    public var httpBaseURL: URL?
    public var identitySource: IdentitySource
    /// Whether a device with an identity may use HTTP when the overlay is unreachable. Off unless set.
    public var allowHTTPFallback: Bool

    public init(
        mode: Mode = .ziti,
        httpBaseURL: URL? = nil,
        identitySource: IdentitySource,
        allowHTTPFallback: Bool = false
    ) {
        self.mode = mode
        self.httpBaseURL = httpBaseURL
        self.identitySource = identitySource
        self.allowHTTPFallback = allowHTTPFallback
    }

    /// Reads the configuration from `environment` (the process environment, or an app's settings as a
    /// dictionary). Unknown values are refused rather than guessed, so a typo cannot quietly pick a mode.
    public init(environment: [String: String]) throws(ILSError) {
        let rawMode = environment["NETWORKING_MODE"]?.trimmingCharacters(in: .whitespaces).lowercased() ?? "ziti"
        guard let mode = Mode(rawValue: rawMode) else {
            throw ILSError(.invalidArgument, "NETWORKING_MODE must be 'ziti' or 'http', not '\(rawMode.prefix(40))'")
        }
        var baseURL: URL?
        if let raw = environment["ILS_HTTP_BASE_URL"], !raw.isEmpty {
            guard let url = URL(string: raw), let scheme = url.scheme?.lowercased(),
                scheme == "https" || scheme == "http",
                url.host != nil
            else {
                throw ILSError(
                    .invalidArgument,
                    "ILS_HTTP_BASE_URL must be an http(s) URL such as https://gateway.example.com"
                )
            }
            baseURL = url
        }
        let source: IdentitySource
        switch (environment["ILS_IDENTITY_FILE"], environment["ILS_IDENTITY_KEYCHAIN"]) {
        case (let path?, nil): source = .file(path)
        case (nil, let account?): source = .keychain(account: account)
        case (nil, nil): source = Self.defaultIdentitySource
        case (_?, _?):
            throw ILSError(.invalidArgument, "give ILS_IDENTITY_FILE or ILS_IDENTITY_KEYCHAIN, not both")
        }
        let fallback: Bool
        switch environment["ILS_ALLOW_HTTP_FALLBACK"]?.lowercased() {
        case nil, "", "0", "false", "no": fallback = false
        case "1", "true", "yes": fallback = true
        case let other?:
            throw ILSError(.invalidArgument, "ILS_ALLOW_HTTP_FALLBACK must be true or false, not '\(other.prefix(20))'")
        }
        self.init(mode: mode, httpBaseURL: baseURL, identitySource: source, allowHTTPFallback: fallback)
    }

    /// The Keychain on Apple platforms, a file elsewhere.
    public static var defaultIdentitySource: IdentitySource {
        #if canImport(Security)
        .keychain(account: "default")
        #else
        .file("identity.json")
        #endif
    }

    /// The store `identitySource` names.
    public func identityStore() throws(ILSError) -> any IdentityStore {
        switch identitySource {
        case .file(let path):
            return FileIdentityStore(path: path)
        case .keychain(let account):
            #if canImport(Security)
            return KeychainIdentityStore(account: account)
            #else
            throw ILSError(.invalidArgument, "the Keychain exists on Apple platforms only; use ILS_IDENTITY_FILE")
            #endif
        }
    }

    /// The path for a device that is (`enrolled`) or is not enrolled.
    public func path(enrolled: Bool) throws(ILSError) -> Path {
        if mode == .ziti, enrolled { return .overlay }
        guard let httpBaseURL else {
            throw ILSError(
                .invalidArgument,
                mode == .http
                    ? "HTTP mode needs ILS_HTTP_BASE_URL"
                    : "this device is not enrolled and no ILS_HTTP_BASE_URL is set: enroll it or set one"
            )
        }
        return .http(httpBaseURL)
    }

    /// What to do when a request through the overlay failed with `error`: HTTP only if the app allowed fallback and
    /// the overlay was unreachable; otherwise the error, for the app to show.
    public func pathAfterOverlayFailure(_ error: URLError) throws(URLError) -> Path {
        guard allowHTTPFallback, let httpBaseURL, let reason = error.ilsReason,
            Self.fallbackReasons.contains(reason)
        else { throw error }
        return .http(httpBaseURL)
    }

    /// The overlay being down, as opposed to the overlay refusing this device.
    public static let fallbackReasons: Set<String> = ["controller_unreachable", "service_unavailable"]
}
