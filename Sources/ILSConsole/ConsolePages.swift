import Foundation
import HTTPTypes
import Hummingbird
import ILSCore
import ILSQRCode
import Logging
import Mustache

/// The console's pages: each one calls the controller's admin API through `AdminCalls` and renders a template.
/// Changes are POST forms (guarded by `ConsoleGuard`) that answer with a redirect to the page they changed
/// (post/redirect/get), or with the page and an error banner when the controller refused.
struct ConsolePages: Sendable {
    let calls: AdminCalls
    let sessions: ConsoleSessions
    let configuration: ConsoleConfiguration
    let library: MustacheLibrary
    let logger: Logger

    static let navigation: [(path: String, label: String)] = [
        ("/identities", "Identities"), ("/sessions", "Sessions"), ("/services", "Services"),
        ("/gateways", "Gateways"), ("/audit", "Audit log"),
    ]

    func register(on router: Router<ConsoleContext>) {
        router.get("/") { _, _ in Response(status: .seeOther, headers: [.location: "/identities"]) }
        router.get("/static/console.css") { _, _ in Self.asset(ConsoleAssets.css, type: "text/css; charset=utf-8") }
        router.get("/static/console.js") { _, _ in
            Self.asset(ConsoleAssets.javaScript, type: "text/javascript; charset=utf-8")
        }
        router.get("/login") { request, _ in signIn(request) }
        router.post("/login") { request, context in try await confirmSignIn(request, context) }
        router.get("/signed-out") { _, _ in
            page(
                "Signed out",
                "message",
                ["heading": "Not signed in", "text": "Run `ils-gateway admin console` for a one-time login link."],
                context: nil,
                status: .unauthorized
            )
        }
        router.post("/logout") { request, context in signOut(request, context) }
        router.post("/login-links") { request, context in loginLink(request, context) }
        registerIdentities(on: router)
        registerSessions(on: router)
        registerServices(on: router)
        registerAudit(on: router)
    }

    // MARK: Sign-in

    /// A login link opened by a person in the browser (from a terminal, pasted, or from another page of this console)
    /// signs in at once. Opened from another site, the session cookie (`SameSite=Strict`) would not come with the
    /// redirect that follows, and the used link would land on "Not signed in"; without `Sec-Fetch-Site` it may be a
    /// chat app's link preview, which must not use the link up. Both get a page with a button that posts the secret
    /// back from this console's own origin, and the link stays unused until it is pressed.
    private func signIn(_ request: Request) -> Response {
        guard let secret = request.uri.queryParameters["t"].map(String.init), !secret.isEmpty else {
            return page("Sign in", "message", Self.refusal(.unknown), context: nil, status: .forbidden)
        }
        let site = request.headers[HTTPField.Name("Sec-Fetch-Site")!]
        guard site == "none" || site == "same-origin" else {
            if let refusal = sessions.check(secret) {
                return page("Sign in", "message", Self.refusal(refusal), context: nil, status: .forbidden)
            }
            return page("Sign in", "login-confirm", ["secret": secret], context: nil)
        }
        return signIn(secret)
    }

    /// The button of `login-confirm`: a form from this console's own page, so the session cookie comes with the
    /// redirect that follows.
    private func confirmSignIn(_ request: Request, _ context: ConsoleContext) async throws -> Response {
        var request = request
        let form = FormFields.decode(String(buffer: try await ConsoleGuard.collectForm(&request, limit: 4096)))
        let guarding = ConsoleGuard(sessions: sessions, configuration: configuration, logger: logger)
        if let why = guarding.crossOrigin(request) {
            // Debug only: any page in the admin's browser can send these, and a refusal without a session writes no
            // line elsewhere either.
            logger.debug("console sign-in refused", metadata: ["reason": "\(why)"])
            return page(
                "Sign in",
                "message",
                [
                    "heading": "Sign-in refused",
                    "text":
                        "This sign-in did not come from the console's own page. Open the login link again and press "
                        + "Sign in there; the link is not used up.",
                ],
                context: nil,
                status: .forbidden
            )
        }
        guard let secret = form["t"], !secret.isEmpty else {
            return page("Sign in", "message", Self.refusal(.unknown), context: nil, status: .forbidden)
        }
        return signIn(secret)
    }

    private func signIn(_ secret: String) -> Response {
        switch sessions.signIn(with: secret) {
        case .failure(let refusal):
            logger.notice("console login link refused", metadata: ["reason": "\(refusal)"])
            return page("Sign in", "message", Self.refusal(refusal), context: nil, status: .forbidden)
        case .success(let session):
            logger.notice("console signed in", metadata: ["sessions": "\(sessions.sessionCount)"])
            var response = Response(status: .seeOther, headers: [.location: "/identities"])
            response.setCookie(sessionCookie(session.id))
            return response
        }
    }

    private static func refusal(_ refusal: ConsoleSessions.LoginRefusal) -> [String: Any] {
        let text =
            switch refusal {
            case .used:
                "This login link was used already: each works once. Run `ils-gateway admin console` again, or make a "
                    + "new link from a signed-in console (Sign in another device)."
            case .expired:
                "This login link expired: each lasts 10 minutes. Run `ils-gateway admin console` again for a new one."
            case .unknown:
                "This login link is not one this console made (it may have restarted, which signs everyone out). Run "
                    + "`ils-gateway admin console` again for a new one."
            }
        return ["heading": "Sign-in refused", "text": text]
    }

    private func signOut(_ request: Request, _ context: ConsoleContext) -> Response {
        if let session = context.session { sessions.signOut(id: session.id) }
        var response = Response(status: .seeOther, headers: [.location: "/signed-out"])
        response.setCookie(sessionCookie("", maxAge: 0))
        return response
    }

    /// A new one-time link for another browser (a phone), shown as text and as a QR code.
    private func loginLink(_ request: Request, _ context: ConsoleContext) -> Response {
        let path = "/login?t=" + sessions.mintLogin()
        let authority = request.head.authority ?? "\(configuration.host):\(configuration.port)"
        let link = "\(configuration.scheme)://\(authority)\(path)"
        var values: [String: Any] = ["link": link, "path": path]
        if let png = try? QRMatrix.encode(link, level: .medium).png(scale: 6) {
            values["png"] = Data(png).base64EncodedString()
        }
        logger.notice("console login link made for another device")
        return page("Sign in another device", "login-link", values, context: context)
    }

    /// HttpOnly and SameSite=Strict always; Secure (and the `__Host-` name) under TLS. A session cookie: it ends when
    /// the browser does, and the console forgets it sooner (idle or absolute timeout). `maxAge: 0` deletes it.
    private func sessionCookie(_ value: String, maxAge: Int? = nil) -> Cookie {
        Cookie(
            name: configuration.cookieName,
            value: value,
            maxAge: maxAge,
            path: "/",
            secure: configuration.usesTLS,
            httpOnly: true,
            sameSite: .strict
        )
    }

    // MARK: Rendering

    /// `template` inside the layout. `context` nil renders the signed-out chrome (no navigation, no forms).
    func page(
        _ title: String,
        _ template: String,
        _ values: [String: Any],
        context: ConsoleContext?,
        status: HTTPResponse.Status = .ok,
        error: String? = nil,
        notice: String? = nil,
        refresh: Int = 0,
        request: Request? = nil
    ) -> Response {
        var values = values
        let csrf = context?.session?.csrf ?? ""
        values["csrf"] = csrf
        let body = library.render(values, withTemplate: template) ?? ""
        var layout: [String: Any] = [
            "title": title, "body": body, "csrf": csrf, "refresh": refresh, "actor": calls.actor,
        ]
        if context?.session != nil {
            layout["signedIn"] = true
            layout["nav"] = Self.navigation.map { item -> [String: Any] in
                ["path": item.path, "label": item.label, "here": request?.uri.path.hasPrefix(item.path) ?? false]
            }
            // Only shown, never trusted: anything on the gateway's host can send this header to 127.0.0.1.
            if let via = request?.headers[HTTPField.Name("X-ILS-Identity")!], (try? IdentityName.validate(via)) != nil {
                layout["via"] = via
            }
        }
        if let error { layout["error"] = error }
        if let notice { layout["notice"] = notice }
        let html = library.render(layout, withTemplate: "layout") ?? ""
        return Response(
            status: status,
            headers: [.contentType: "text/html; charset=utf-8"],
            body: ResponseBody(byteBuffer: ByteBuffer(string: html))
        )
    }

    /// A change's outcome: back to `path`, whose next load says `notice` (kept in the session, not the URL).
    func changed(_ path: String, notice: String, context: ConsoleContext) -> Response {
        if let id = context.session?.id { sessions.setNotice(notice, for: id) }
        return Response(status: .seeOther, headers: [.location: path])
    }

    /// The controller's refusal as an HTTP status of the console's own answer.
    static func status(of error: ILSError) -> HTTPResponse.Status {
        switch error.code {
        case .invalidArgument, .invalidInput: .badRequest
        case .notFound: .notFound
        case .conflict: .conflict
        case .permissionDenied: .forbidden
        default: .badGateway
        }
    }

    static func plain(_ status: HTTPResponse.Status, _ text: String) -> Response {
        Response(
            status: status,
            headers: [.contentType: "text/plain; charset=utf-8"],
            body: ResponseBody(byteBuffer: ByteBuffer(string: text + "\n"))
        )
    }

    private static func asset(_ text: String, type: String) -> Response {
        Response(
            status: .ok,
            headers: [.contentType: type],
            body: ResponseBody(byteBuffer: ByteBuffer(string: text))
        )
    }

    static func time(_ seconds: Int64?) -> String {
        guard let seconds else { return "never" }
        return Date(timeIntervalSince1970: TimeInterval(seconds)).formatted(.iso8601)
    }
}
