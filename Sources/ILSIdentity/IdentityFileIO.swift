public import Foundation
public import ILSCore
import ILSCrypto

/// Reading and writing identity files: written with mode 0600 and atomically (`SecureFile`), never over an existing
/// file unless asked.
public enum IdentityFileIO {
    public static func write(_ file: IdentityFile, to path: String, overwrite: Bool) throws(ILSError) {
        try SecureFile.write(try encode(file), to: path, overwrite: overwrite)
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
    @discardableResult
    public static func learn(_ announced: [ControllerAddress], path: String, certificate: String) -> Bool {
        guard let file = try? read(path), file.certificate == certificate, let learned = file.learning(announced)
        else { return false }
        return (try? write(learned, to: path, overwrite: true)) != nil
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
