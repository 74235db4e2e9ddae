import HTTPTypes
import Hummingbird
import ILSCore
import Logging

/// What every request passes before a page sees it, in this order:
/// 1. `Host` must be a loopback name, the listen address, or one of the allowed hosts: anything else is 421, which
///    defeats DNS rebinding (a hostile page whose name resolves to 127.0.0.1 still sends its own name as Host).
/// 2. The public paths (sign-in, signed-out, static files) pass; every other needs a live session cookie. A GET
///    without one is sent to /signed-out (no secret in that URL); anything else is 403.
/// 3. Every request that is not GET or HEAD must carry the session's CSRF token in its `csrf` form field, and, when the
///    browser sends them, an `Origin` equal to this console's and `Sec-Fetch-Site: same-origin`. Otherwise 403 and a
///    log line. The one exception is `POST /login` (the button of a login link opened from another site): it has no
///    session yet, so it carries the login secret instead of a token and passes the same origin checks itself. GET
///    handlers change nothing, but for `GET /login`, which uses a link a person opened.
/// Every answer gets the security headers (a strict Content-Security-Policy, no caching, no framing, referrers only to
/// this origin).
struct ConsoleGuard: RouterMiddleware {
    typealias Context = ConsoleContext

    let sessions: ConsoleSessions
    let configuration: ConsoleConfiguration
    let logger: Logger

    static let publicPaths: Set<String> = ["/login", "/signed-out", "/static/console.css", "/static/console.js"]

    func handle(
        _ request: Request,
        context: ConsoleContext,
        next: (Request, ConsoleContext) async throws -> Response
    ) async throws -> Response {
        var response: Response
        do {
            response = try await guarded(request, context: context, next: next)
        } catch let error as HTTPError {
            // A body too slow (`collectForm`), or a route's own HTTP error: answered here, so it gets the security
            // headers too.
            response = ConsolePages.plain(error.status, error.body ?? "The request was refused.")
        } catch let error as any HTTPResponseError {
            // Any other error that carries a status (a form body over the upload limit is NIOCore's
            // `NIOTooManyBytesError`, 413): Hummingbird would answer it past this middleware, without the headers.
            response = ConsolePages.plain(error.status, Self.sentence(for: error.status))
        } catch {
            logger.error("console request failed", metadata: ["error": "\(error)"])
            response = ConsolePages.plain(.internalServerError, "The console could not answer this request.")
        }
        Self.secure(&response.headers)
        return response
    }

    private func guarded(
        _ request: Request,
        context: ConsoleContext,
        next: (Request, ConsoleContext) async throws -> Response
    ) async throws -> Response {
        var request = request
        var context = context
        guard isAllowed(host: request.head.authority) else {
            logger.notice(
                "console request refused: Host is not this console's",
                metadata: ["path": "\(request.uri.path.prefix(100))"]
            )
            return ConsolePages.plain(.misdirectedRequest, "This console does not answer to that host name.")
        }
        if Self.publicPaths.contains(request.uri.path) {
            return try await next(request, context)
        }
        // A page's own refresh (console.js adds auto=1) is not activity: it does not extend the idle timeout.
        let automatic = request.method == .get && request.uri.queryParameters["auto"] == "1"
        guard let id = request.cookies[configuration.cookieName]?.value,
            let session = sessions.session(id: id, touch: !automatic)
        else {
            if request.method == .get || request.method == .head {
                return Response(status: .seeOther, headers: [.location: "/signed-out"])
            }
            return ConsolePages.plain(
                .forbidden,
                "Not signed in: open a new login link from `ils-gateway admin console`."
            )
        }
        context.session = session
        if request.method != .get && request.method != .head {
            let body = try await Self.collectForm(&request, limit: context.maxUploadSize)
            context.form = FormFields.decode(String(buffer: body))
            guard let token = context.form["csrf"], ConsoleSessions.equal(token, session.csrf) else {
                return refuse(request, "the form's CSRF token is missing or wrong")
            }
            if let why = crossOrigin(request) { return refuse(request, why) }
        }
        return try await next(request, context)
    }

    /// Why a form post did not come from one of this console's own pages, or `nil`: an `Origin` that is not this
    /// console's, or a `Sec-Fetch-Site` other than `same-origin` (a browser sends both; a header absent is no proof
    /// either way, which the CSRF token or the login secret covers).
    func crossOrigin(_ request: Request) -> String? {
        if let origin = request.headers[.origin], origin != self.origin(of: request) {
            return "the request came from another origin"
        }
        if let site = request.headers[HTTPField.Name("Sec-Fetch-Site")!], site != "same-origin" {
            return "the browser says the request is \(ControlCharacters.bounded(site, limit: 20))"
        }
        return nil
    }

    /// The form body, at most `limit` bytes and 10 s: a client that sends it slower is cut off.
    static func collectForm(_ request: inout Request, limit: Int) async throws -> ByteBuffer {
        let pending = request
        let body = try await withThrowingTaskGroup(of: ByteBuffer?.self) { group in
            group.addTask {
                var request = pending
                return try await request.collectBody(upTo: limit)
            }
            group.addTask {
                try await Task.sleep(for: .seconds(10))
                return nil
            }
            defer { group.cancelAll() }
            guard let first = try await group.next(), let body = first else {
                throw HTTPError(.requestTimeout, message: "the form took too long to arrive")
            }
            return body
        }
        request.body = .init(buffer: body)
        return body
    }

    private func refuse(_ request: Request, _ why: String) -> Response {
        logger.warning("console change refused: \(why)", metadata: ["path": "\(request.uri.path.prefix(100))"])
        return ConsolePages.plain(.forbidden, "This change was refused: \(why). Reload the page and try again.")
    }

    /// `scheme://Host` as the browser addressed this console.
    private func origin(of request: Request) -> String {
        "\(configuration.scheme)://\(request.head.authority ?? "")"
    }

    /// Loopback at any port, the listen address (unless it is a wildcard), or an allowed host with or without a
    /// port (`HostAllowList`, the tunnel's rule too).
    func isAllowed(host authority: String?) -> Bool {
        configuration.hostAllowList.allows(authority: authority)
    }

    /// What the console says for a status it answers without a page of its own.
    static func sentence(for status: HTTPResponse.Status) -> String {
        switch status {
        case .contentTooLarge: "The form is too large to send."
        case .requestTimeout: "The form took too long to arrive."
        default: "The request was refused (\(status.code))."
        }
    }

    static func secure(_ headers: inout HTTPFields) {
        headers[.contentSecurityPolicy] =
            "default-src 'none'; img-src 'self' data:; style-src 'self'; script-src 'self'; form-action 'self'; "
            + "frame-ancestors 'none'; base-uri 'none'"
        headers[.xContentTypeOptions] = "nosniff"
        // same-origin, not no-referrer: under no-referrer Chromium sends `Origin: null` with a form, which the
        // origin check must refuse. The one page loaded from a URL with a secret (a login link opened from another
        // site) sends its requests (style, script, the button's post) to the console itself, which made the secret
        // and logs no request URL or referrer; its script also takes the secret out of the address bar.
        headers[HTTPField.Name("Referrer-Policy")!] = "same-origin"
        headers[.cacheControl] = "no-store"
        headers[HTTPField.Name("X-Frame-Options")!] = "DENY"
    }
}

/// `application/x-www-form-urlencoded` into fields; a repeated field keeps its last value. Bounded by the context's
/// upload size. Written here rather than through Hummingbird's `URLEncodedFormDecoder` because the guard needs the
/// raw fields (the CSRF token) before any page's typed form exists.
enum FormFields {
    static func decode(_ text: String) -> [String: String] {
        var fields: [String: String] = [:]
        for pair in text.split(separator: "&") {
            let parts = pair.split(separator: "=", maxSplits: 1, omittingEmptySubsequences: false)
            guard let name = decodeComponent(parts[0]) else { continue }
            fields[name] = parts.count > 1 ? decodeComponent(parts[1]) ?? "" : ""
        }
        return fields
    }

    private static func decodeComponent(_ text: Substring) -> String? {
        text.replacingOccurrences(of: "+", with: " ").removingPercentEncoding
    }
}
