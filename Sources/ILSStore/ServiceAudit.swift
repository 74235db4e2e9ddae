package import ILSCore

/// What the audit log says about a service or attribute change, the same from every store, and the one refusal of a
/// lost update.
package enum ServiceAudit {
    package static func created(_ service: ServiceRecord) -> String {
        "dial=\(service.dial.description) bind=\(service.bind.description)"
    }

    package static func updated(from old: ServiceRecord, to new: ServiceRecord) -> String {
        var parts: [String] = []
        // The new policy first: a long old one is what the 512-character bound cuts.
        if old.dial != new.dial { parts.append("dial=\(new.dial.description) (was \(old.dial.description))") }
        if old.bind != new.bind { parts.append("bind=\(new.bind.description) (was \(old.bind.description))") }
        return parts.isEmpty ? "unchanged (revision \(new.revision))" : parts.joined(separator: "; ")
    }

    package static func attributes(from old: [String], to new: [String]) -> String {
        "[\(new.joined(separator: ","))] (was [\(old.joined(separator: ","))])"
    }

    package static func stale(_ name: String) -> ILSError {
        ILSError(.conflict, "service '\(name)' was changed meanwhile; read it again and repeat the change")
    }
}
