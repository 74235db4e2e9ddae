public import Foundation
public import ILSCore

#if canImport(Glibc)
import Glibc
/// `write(2)`, named apart from `SecureFile.write`; one spelling per C library, so no platform's module is named where
/// it does not exist.
private let systemWrite = Glibc.write
#elseif canImport(Musl)
import Musl
private let systemWrite = Musl.write
#elseif canImport(Darwin)
import Darwin
private let systemWrite = Darwin.write
#endif

/// Writes files that hold secrets: mode 0600 from the first byte, atomically, never half-written.
///
/// The content goes to a temporary file created with `O_EXCL` and mode 0600 in the same directory, is `fsync`ed,
/// then moved into place: with `rename` when replacing is allowed, with `link` otherwise, so an existing file is
/// never replaced by accident even when two writers race. On any failure the temporary file is removed and the
/// destination is untouched.
public enum SecureFile {
    public static func write(_ data: Data, to path: String, overwrite: Bool) throws(ILSError) {
        try reserve(path, bytes: 0).commit(data, overwrite: overwrite)
    }

    /// Creates the temporary file for `path` now and makes it hold `bytes` bytes on disk (written and `fsync`ed),
    /// so that "is there room?" is answered before something that cannot be undone (an enrollment token spent);
    /// the content comes later with `commit`, into blocks the file system already gave us. Nothing exists at
    /// `path` until then, and `abandon` leaves nothing behind.
    public static func reserve(_ path: String, bytes: Int) throws(ILSError) -> Reservation {
        let directory = (path as NSString).deletingLastPathComponent
        let dir = directory.isEmpty ? "." : directory
        let temporary = "\(dir)/.\((path as NSString).lastPathComponent).\(UUID().uuidString).tmp"
        let fd = open(temporary, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0o600)
        guard fd >= 0 else {
            throw ILSError(.cannotWrite, "could not create a file in \(dir): \(String(cString: strerror(errno)))")
        }
        let reservation = Reservation(path: path, directory: dir, temporary: temporary, fd: fd)
        if bytes > 0 {
            guard writeAll(Data(count: bytes), to: fd), fsync(fd) == 0 else {
                let reason = String(cString: strerror(errno))
                reservation.abandon()
                throw ILSError(.cannotWrite, "could not write \(path): \(reason)")
            }
        }
        return reservation
    }

    /// A temporary file that will become `path`: `commit` puts the content in place atomically, `abandon` removes
    /// it. Exactly one of the two should run; both are safe to call again.
    public final class Reservation: @unchecked Sendable {
        // @unchecked: used by one caller at a time, like the file descriptor it holds.
        public let path: String
        private let directory: String
        private let temporary: String
        private var fd: Int32

        fileprivate init(path: String, directory: String, temporary: String, fd: Int32) {
            self.path = path
            self.directory = directory
            self.temporary = temporary
            self.fd = fd
        }

        deinit { abandon() }

        /// Writes `data` over the reserved bytes (the file is cut to its length), `fsync`s it and moves it to
        /// `path`: with `rename` when replacing is allowed, with `link` otherwise, so an existing file is never
        /// replaced by accident even when two writers race. On failure `path` is untouched and nothing is left.
        public func commit(_ data: Data, overwrite: Bool) throws(ILSError) {
            guard fd >= 0 else { throw ILSError(.internalError, "\(path) was already written or abandoned") }
            var failure: ILSError?
            if lseek(fd, 0, SEEK_SET) != 0 || !SecureFile.writeAll(data, to: fd)
                || ftruncate(fd, off_t(data.count)) != 0 || fsync(fd) != 0
            {
                failure = ILSError(.cannotWrite, "could not write \(path): \(String(cString: strerror(errno)))")
            }
            close(fd)
            fd = -1
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
            let dirFD = open(directory, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
            if dirFD >= 0 {
                fsync(dirFD)
                close(dirFD)
            }
        }

        /// Removes the temporary file; `path` was never touched.
        public func abandon() {
            guard fd >= 0 else { return }
            close(fd)
            fd = -1
            unlink(temporary)
        }
    }

    fileprivate static func writeAll(_ data: Data, to fd: Int32) -> Bool {
        data.withUnsafeBytes { buffer -> Bool in
            var offset = 0
            while offset < buffer.count {
                let result = systemWrite(fd, buffer.baseAddress! + offset, buffer.count - offset)
                if result < 0 {
                    if errno == EINTR { continue }
                    return false
                }
                offset += result
            }
            return true
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
