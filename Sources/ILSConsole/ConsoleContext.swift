public import Hummingbird

/// A request's context: the signed-in session once `ConsoleGuard` found one, and the form fields it read.
public struct ConsoleContext: RequestContext {
    public var coreContext: CoreRequestContextStorage
    /// Set by `ConsoleGuard` for every route but the public ones (login, signed-out, static files).
    public var session: ConsoleSessions.Session?
    /// The decoded `application/x-www-form-urlencoded` body of a POST, which the guard already read for its CSRF
    /// check.
    public var form: [String: String] = [:]

    public init(source: Source) {
        self.coreContext = .init(source: source)
    }

    /// Forms are small: 64 KiB is far above any of the console's.
    public var maxUploadSize: Int { 64 * 1024 }
}
