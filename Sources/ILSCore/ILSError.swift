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

        /// Not public: the set is closed. Every code is declared below, once, with an exit status no other code has
        /// (`all`; `ILSErrorCodeTests` checks both), as swift-certificates declares its `ErrorCode`s.
        init(_ name: String, exitCode: Int32) {
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

        // Enrollment refusals (`EnrollmentRefusal`): 80-88, one per reason, so a script can tell them apart.
        public static let tokenMalformed = Code("token_malformed", exitCode: 80)
        public static let tokenAlgorithm = Code("token_algorithm", exitCode: 81)
        public static let tokenSignature = Code("token_signature", exitCode: 82)
        public static let tokenExpired = Code("token_expired", exitCode: 83)
        public static let tokenUsed = Code("token_used", exitCode: 84)
        public static let tokenUnknown = Code("token_unknown", exitCode: 85)
        public static let tokenIssuer = Code("token_issuer", exitCode: 86)
        public static let tokenCAMismatch = Code("token_ca_mismatch", exitCode: 87)
        public static let enrollProof = Code("enroll_proof", exitCode: 88)

        // A config file refused (ILSConfig): 90-94, so a script or a unit manager can tell a missing file from a typo
        // without reading the sentence.
        /// `--config` names a file that does not exist.
        public static let configMissing = Code("config_missing", exitCode: 90)
        /// The file exists but cannot be read (permissions, a directory, not UTF-8).
        public static let configUnreadable = Code("config_unreadable", exitCode: 91)
        /// The file is not YAML, or not a mapping of `key: value` lines.
        public static let configSyntax = Code("config_syntax", exitCode: 92)
        /// A key the command does not know, or the same key twice.
        public static let configUnknownKey = Code("config_unknown_key", exitCode: 93)
        /// A known key whose value has the wrong type (a list where a path goes, text where a number goes).
        public static let configWrongType = Code("config_wrong_type", exitCode: 94)

        // A circuit's end-to-end layer (ILSCrypto, ILSFabric): 95-97. They end circuits, rarely a command; each has
        // its own status all the same (they shared internal_error's 70 once).
        /// The end-to-end handshake failed: a wrong peer, an invalid certificate or message.
        public static let e2eHandshakeFailed = Code("e2e_handshake_failed", exitCode: 95)
        /// A record failed authentication: altered, reordered, replayed, or after FINAL.
        public static let e2eRecordInvalid = Code("e2e_record_invalid", exitCode: 96)
        /// A peer sent further ahead of its ACKs than any end may keep.
        public static let e2eWindowExceeded = Code("e2e_window_exceeded", exitCode: 97)

        /// Every code there is.
        public static let all: [Code] = [
            invalidArgument, invalidInput, cannotWrite, unavailable, notFound, permissionDenied, conflict,
            internalError, tokenMalformed, tokenAlgorithm, tokenSignature, tokenExpired, tokenUsed, tokenUnknown,
            tokenIssuer, tokenCAMismatch, enrollProof, configMissing, configUnreadable, configSyntax, configUnknownKey,
            configWrongType, e2eHandshakeFailed, e2eRecordInvalid, e2eWindowExceeded,
        ]

        /// The code named `name`, if there is one (a controller's JSON error carries the name).
        public init?(name: String) {
            guard let code = Self.all.first(where: { $0.name == name }) else { return nil }
            self = code
        }
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
