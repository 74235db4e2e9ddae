import Hummingbird
import ILSCore

/// `/audit`: the log, newest page first, filtered by actor, action (or an action family ending in ".") and target,
/// through the controller's own filters, paged by sequence number.
extension ConsolePages {
    static let auditPageSize = 50

    func registerAudit(on router: Router<ConsoleContext>) {
        router.get("/audit") { request, context in await auditPage(request, context) }
    }

    private func auditPage(_ request: Request, _ context: ConsoleContext) async -> Response {
        // The filter form is a GET form: decoded as one (`+` is a space), not as Hummingbird's query parameters.
        let fields = FormFields.decode(request.uri.query ?? "")
        var query: [String: String] = [:]
        for name in ["actor", "action", "target", "before"] {
            if let value = fields[name], !value.isEmpty { query[name] = value }
        }
        var values: [String: Any] = [
            "actor": query["actor"] ?? "", "action": query["action"] ?? "", "target": query["target"] ?? "",
        ]
        var error: String?
        var status = HTTPResponse.Status.ok
        do throws(ILSError) {
            let filter = try ControllerAPI.AuditFilter(query: query)
            var before: Int64?
            if let text = query["before"] {
                guard let value = Int64(text), value > 0 else {
                    throw ILSError(.invalidArgument, "'before' must be a positive whole number")
                }
                before = value
            }
            let page = try await calls.audit(before: before, limit: Self.auditPageSize, filter: filter)
            values["rows"] = page.entries.reversed().map { entry -> [String: Any] in
                [
                    "seq": entry.seq, "at": Self.time(entry.at), "actor": entry.actor, "action": entry.action,
                    "target": entry.target, "detail": entry.detail,
                ]
            }
            let filters = filter.queryParameters
            if let next = page.nextBefore { values["older"] = "/audit?before=\(next)\(filters)" }
            if before != nil { values["newer"] = "/audit?" + filters.dropFirst() }
        } catch let failure {
            error = failure.reason
            status = Self.status(of: failure)
        }
        return page("Audit log", "audit", values, context: context, status: status, error: error, request: request)
    }
}
