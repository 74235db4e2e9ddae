public import Foundation
public import ILSCore

/// Notices that a running process's identity file was given a new certificate by someone else (`ils-gateway renew`
/// run by hand or from a timer), so the process moves to it instead of going on with the one it loaded at start.
///
/// The controller routes nothing to a gateway link made with a replaced certificate, and refuses a device's circuits
/// on one: without this, a manual renewal would leave a running gateway or tunnel with a certificate that no longer
/// works until it was restarted. Polls the file's modification time (one `stat` per check); reads and parses the file
/// only when that changed.
public struct IdentityFileWatcher: Sendable {
    public let path: String
    private var modified: Date?
    private var certificate: String

    /// - Parameter current: the identity the process uses now.
    public init(path: String, current: IdentityFile) {
        self.path = path
        self.certificate = current.certificate
        self.modified = Self.modificationDate(path)
    }

    /// A changed identity for the same identity id, with a certificate other than the one in use; `nil` when the file
    /// is unchanged, unreadable (being replaced: the next check sees it), or for another identity.
    public mutating func changed(identityID: String) -> IdentityFile? {
        let modified = Self.modificationDate(path)
        guard modified != self.modified else { return nil }
        guard let file = try? IdentityFileIO.read(path) else { return nil }
        self.modified = modified
        guard file.identity.id == identityID, file.certificate != certificate else { return nil }
        certificate = file.certificate
        return file
    }

    /// Marks `file` as the identity in use (after the process renewed by itself and wrote the file).
    public mutating func using(_ file: IdentityFile) {
        certificate = file.certificate
        modified = Self.modificationDate(path)
    }

    /// How often a long-running process looks at its identity file.
    public static let interval: Duration = .seconds(2)

    private static func modificationDate(_ path: String) -> Date? {
        (try? FileManager.default.attributesOfItem(atPath: path))?[.modificationDate] as? Date
    }
}
