import Foundation
public import ILSCore

/// Where a device keeps its identity (certificate, private key, CA, controller address). An app implements it
/// to keep the identity where its platform wants secrets kept; ILSClient gives a 0600 file (`FileIdentityStore`,
/// the default) and, on Apple platforms, the Keychain (`KeychainIdentityStore`).
///
/// The private key is in the identity: an implementation must keep it on this device (no sync, no backup that
/// leaves the device) and readable by this app only.
public protocol IdentityStore: Sendable {
    /// The stored identity, or nil when the device is not enrolled.
    func load() throws(ILSError) -> IdentityFile?
    /// Stores `identity`, replacing any stored one.
    func save(_ identity: IdentityFile) throws(ILSError)
    /// Forgets the stored identity; nothing stored is not an error.
    func delete() throws(ILSError)
}

extension IdentityStore {
    /// Saves the cluster's controller list, as a controller just named it, into the stored identity, if it still
    /// holds `certificate` (a renewal may have replaced it since) and the list changed (`IdentityFile.learning`).
    /// Returns whether it saved.
    @discardableResult
    public func learn(_ announced: [ControllerAddress], certificate: String) throws(ILSError) -> Bool {
        guard let stored = try load(), stored.certificate == certificate, let learned = stored.learning(announced)
        else { return false }
        try save(learned)
        return true
    }
}

/// The identity in a JSON file written with mode 0600, atomically (`IdentityFileIO`): the same file
/// `ils-gateway enroll` writes and `ils-gateway tunnel` reads.
public struct FileIdentityStore: IdentityStore {
    public let path: String

    public init(path: String) {
        self.path = path
    }

    public func load() throws(ILSError) -> IdentityFile? {
        do {
            return try IdentityFileIO.read(path)
        } catch  where error.code == .notFound {
            return nil
        }
    }

    public func save(_ identity: IdentityFile) throws(ILSError) {
        try IdentityFileIO.write(identity, to: path, overwrite: true)
    }

    public func delete() throws(ILSError) {
        guard FileManager.default.fileExists(atPath: path) else { return }
        do {
            try FileManager.default.removeItem(atPath: path)
        } catch {
            throw ILSError(.cannotWrite, "could not remove \(path): \(error.localizedDescription)")
        }
    }
}
