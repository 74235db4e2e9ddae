public import Foundation
public import ILSCore
import ILSCrypto

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif

/// Reading and writing identity files: written with mode 0600 and atomically (`SecureFile`), never over an existing
/// file unless asked.
public enum IdentityFileIO {
    /// Replacing a file is done under the identity directory's lock (`locked`): a renewal's write and a controller
    /// list being learned (`learn`) never undo each other.
    public static func write(_ file: IdentityFile, to path: String, overwrite: Bool) throws(ILSError) {
        guard overwrite else {
            try SecureFile.write(try encode(file), to: path, overwrite: false)
            return
        }
        let data = try encode(file)
        var failure: ILSError?
        locked(path) {
            do throws(ILSError) {
                try SecureFile.write(data, to: path, overwrite: true)
            } catch {
                failure = error
            }
        }
        if let failure { throw failure }
    }

    /// Runs `body` holding an exclusive `flock` on the directory that holds `path`, so read-compare-write sequences on
    /// identity files there are atomic across threads and processes (`ils-gateway renew` from a timer, a running
    /// tunnel learning the cluster). The directory, not a lock file beside the identity: nothing extra is left in
    /// `identities/`. A directory that cannot be opened or locked runs `body` unlocked (as before this lock existed).
    static func locked(_ path: String, _ body: () -> Void) {
        let directory = (path as NSString).deletingLastPathComponent
        let descriptor = open(directory.isEmpty ? "." : directory, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        guard descriptor >= 0 else {
            body()
            return
        }
        defer { close(descriptor) }
        var held = flock(descriptor, LOCK_EX) == 0
        while !held, errno == EINTR { held = flock(descriptor, LOCK_EX) == 0 }
        body()
        if held { _ = flock(descriptor, LOCK_UN) }
    }

    /// The file's bytes as `write` stores them; enrollment writes them into a file it reserved before spending the
    /// token (`SecureFile.reserve`), so it needs the bytes without the write.
    package static func encode(_ file: IdentityFile) throws(ILSError) -> Data {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.prettyPrinted, .sortedKeys, .withoutEscapingSlashes]
        guard let data = try? encoder.encode(file) else { throw ILSError(.internalError, "could not encode") }
        return data
    }

    /// Writes the cluster's controller list, as a controller just named it, into the identity file at `path`, so the
    /// next command or process fails over to replicas that joined after the file was written. The file is read again
    /// first and written (atomically, 0600) only if it still holds `certificate` (a renewal elsewhere may have
    /// replaced it, and its own answer carried the list) and the list changed. Returns whether it wrote; never
    /// throws: learning the list must not fail what the identity was used for.
    /// The background queue `learnInBackground` writes on: one, serial, so two lists learned in turn are written in
    /// that order.
    private static let learning = DispatchQueue(label: "ils.identity-file.learn")

    /// `learn`, off the caller's thread (an event loop must not wait for a file write and its fsync), in the order of
    /// the calls.
    public static func learnInBackground(_ announced: [ControllerAddress], path: String, certificate: String) {
        learning.async { learn(announced, path: path, certificate: certificate) }
    }

    /// A file owned by another user (a `sudo ils-gateway admin …` on a service's file) is left alone: replacing it
    /// would hand it to this user, and the service could no longer read it.
    @discardableResult
    public static func learn(_ announced: [ControllerAddress], path: String, certificate: String) -> Bool {
        guard let owner = (try? FileManager.default.attributesOfItem(atPath: path))?[.ownerAccountID] as? NSNumber,
            owner.uint32Value == UInt32(geteuid())
        else { return false }
        var wrote = false
        locked(path) {
            guard let file = try? read(path), file.certificate == certificate, let learned = file.learning(announced),
                let data = FileManager.default.contents(atPath: path),
                let updated = replacingControllers(in: data, with: learned.controllers)
            else { return }
            wrote = (try? SecureFile.write(updated, to: path, overwrite: true)) != nil
        }
        return wrote
    }

    /// The file's JSON with its `controllers` replaced and every other key kept as it was, those this version does
    /// not know included (a later version's, another client's: identities.md says readers ignore them, so a
    /// background write must not drop them). Nil if the result would not read back as the same identity.
    static func replacingControllers(in data: Data, with controllers: [String]) -> Data? {
        guard var object = (try? JSONSerialization.jsonObject(with: data)) as? [String: Any] else { return nil }
        object["controllers"] = controllers
        guard
            let updated = try? JSONSerialization.data(
                withJSONObject: object,
                options: [.prettyPrinted, .sortedKeys, .withoutEscapingSlashes]
            ),
            let before = try? JSONDecoder().decode(IdentityFile.self, from: data),
            let after = try? JSONDecoder().decode(IdentityFile.self, from: updated),
            after.certificate == before.certificate, after.privateKey == before.privateKey,
            after.identity.id == before.identity.id, after.controllers == controllers
        else { return nil }
        return updated
    }

    public static func read(_ path: String) throws(ILSError) -> IdentityFile {
        guard let data = FileManager.default.contents(atPath: path) else {
            throw ILSError(.notFound, "no identity file at \(path); enroll first or give --identity FILE")
        }
        guard let file = try? JSONDecoder().decode(IdentityFile.self, from: data) else {
            throw ILSError(.invalidInput, "\(path) is not an ils-gateway identity file")
        }
        return file
    }
}
