public import Foundation
public import ILSCore

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif

/// Writes files that hold secrets: mode 0600 from the first byte, atomically, never half-written.
///
/// The content goes to a temporary file created with `O_EXCL` and mode 0600 in the same directory, is `fsync`ed,
/// then moved into place: with `rename` when replacing is allowed, with `link` otherwise, so an existing file is
/// never replaced by accident even when two writers race. On any failure the temporary file is removed and the
/// destination is untouched.
public enum SecureFile {
    public static func write(_ data: Data, to path: String, overwrite: Bool) throws(ILSError) {
        let directory = (path as NSString).deletingLastPathComponent
        let dir = directory.isEmpty ? "." : directory
        let temporary = "\(dir)/.\((path as NSString).lastPathComponent).\(UUID().uuidString).tmp"
        let fd = open(temporary, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0o600)
        guard fd >= 0 else {
            throw ILSError(.cannotWrite, "could not create a file in \(dir): \(String(cString: strerror(errno)))")
        }
        var failure: ILSError?
        let written = data.withUnsafeBytes { buffer -> Bool in
            var offset = 0
            while offset < buffer.count {
                let result = Glibc.write(fd, buffer.baseAddress! + offset, buffer.count - offset)
                if result < 0 {
                    if errno == EINTR { continue }
                    return false
                }
                offset += result
            }
            return true
        }
        if !written || fsync(fd) != 0 {
            failure = ILSError(.cannotWrite, "could not write \(path): \(String(cString: strerror(errno)))")
        }
        close(fd)
        if failure == nil {
            if overwrite {
                if rename(temporary, path) != 0 {
                    failure = ILSError(.cannotWrite, "could not write \(path): \(String(cString: strerror(errno)))")
                }
            } else if link(temporary, path) != 0 {
                failure =
                    errno == EEXIST
                    ? ILSError(.cannotWrite, "\(path) already exists; not overwriting it")
                    : ILSError(.cannotWrite, "could not write \(path): \(String(cString: strerror(errno)))")
            }
        }
        unlink(temporary)
        if let failure { throw failure }
        let dirFD = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        if dirFD >= 0 {
            fsync(dirFD)
            close(dirFD)
        }
    }

    /// Creates a directory readable only by its owner (0700), with its parents.
    public static func createPrivateDirectory(_ path: String) throws(ILSError) {
        do {
            try FileManager.default.createDirectory(
                atPath: path,
                withIntermediateDirectories: true,
                attributes: [.posixPermissions: 0o700]
            )
        } catch {
            throw ILSError(.cannotWrite, "could not create directory \(path): \(error.localizedDescription)")
        }
    }
}
