/// The error every ils-gateway module throws at its public edge.
///
/// `code` is API: scripts and tests match on it, and each code maps to a distinct process exit status
/// (see `exitCode`). `reason` is one sentence for a person, safe to print: it never contains a secret, a key or a
/// token. Internal detail that helps a developer but must not reach a network peer goes into `detail`, which is
/// logged at debug level only (the same split tailscale makes with its `vizerror`).
public struct ILSError: Error, Hashable, Sendable, CustomStringConvertible {
    /// A stable identifier for the kind of failure.
    public struct Code: Hashable, Sendable, CustomStringConvertible {
        public let name: String
        /// The process exit status used when this error ends a CLI command.
        public let exitCode: Int32

        public init(_ name: String, exitCode: Int32) {
            self.name = name
            self.exitCode = exitCode
        }

        public var description: String { name }

        /// A command-line argument or configuration value is wrong (like sysexits' EX_USAGE).
        public static let invalidArgument = Code("invalid_argument", exitCode: 64)
        /// A file the user named could not be read or has the wrong content (EX_NOINPUT / EX_DATAERR).
        public static let invalidInput = Code("invalid_input", exitCode: 65)
        /// A file could not be written, or would be overwritten (EX_CANTCREAT).
        public static let cannotWrite = Code("cannot_write", exitCode: 73)
        /// A socket could not be bound or a peer could not be reached (EX_UNAVAILABLE).
        public static let unavailable = Code("unavailable", exitCode: 69)
        /// The named identity, service or file does not exist (EX_NOUSER).
        public static let notFound = Code("not_found", exitCode: 67)
        /// The caller is not allowed to do this: no identity, the wrong role, or a blocked identity (EX_NOPERM).
        public static let permissionDenied = Code("permission_denied", exitCode: 77)
        /// The request conflicts with the current state, e.g. a duplicate name.
        public static let conflict = Code("conflict", exitCode: 79)
        /// Something this program should never do happened (EX_SOFTWARE).
        public static let internalError = Code("internal_error", exitCode: 70)
    }

    public let code: Code
    public let reason: String
    public let detail: String?

    public init(_ code: Code, _ reason: String, detail: String? = nil) {
        self.code = code
        self.reason = reason
        self.detail = detail
    }

    public var description: String { reason }
}
