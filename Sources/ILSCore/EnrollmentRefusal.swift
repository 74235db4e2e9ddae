/// Why an enrollment was refused. Each has a stable code (in the controller's JSON error and in `ILSError`) and
/// its own exit status for `ils-gateway enroll`, so scripts can tell them apart.
public enum EnrollmentRefusal: String, Sendable, CaseIterable {
    case malformedToken = "token_malformed"
    case unsupportedAlgorithm = "token_algorithm"
    case badSignature = "token_signature"
    case expired = "token_expired"
    case used = "token_used"
    case unknown = "token_unknown"
    case wrongIssuer = "token_issuer"
    case caMismatch = "token_ca_mismatch"
    case badProof = "enroll_proof"

    /// Its code, with its own exit status (`ILSError.Code`, 80-88).
    public var code: ILSError.Code {
        switch self {
        case .malformedToken: .tokenMalformed
        case .unsupportedAlgorithm: .tokenAlgorithm
        case .badSignature: .tokenSignature
        case .expired: .tokenExpired
        case .used: .tokenUsed
        case .unknown: .tokenUnknown
        case .wrongIssuer: .tokenIssuer
        case .caMismatch: .tokenCAMismatch
        case .badProof: .enrollProof
        }
    }

    public var exitCode: Int32 { code.exitCode }

    /// One sentence for a person: what happened and what to do.
    public var reason: String {
        switch self {
        case .malformedToken: "the enrollment token is not a valid JWT; copy the whole token again"
        case .unsupportedAlgorithm: "the enrollment token is not signed with EdDSA; it was not issued by a controller"
        case .badSignature:
            "the enrollment token's signature is invalid; it was altered or not issued by this controller"
        case .expired: "the enrollment token has expired; ask an admin for a new one (admin identity reissue NAME)"
        case .used: "the enrollment token was already used; ask an admin for a new one (admin identity reissue NAME)"
        case .unknown: "the controller does not know this enrollment token; ask an admin for a new one"
        case .wrongIssuer: "the enrollment token names a different controller than the one that answered"
        case .caMismatch: "the controller's certificate authority does not match the fingerprint in the token"
        case .badProof: "the enrollment request's proof of key possession is invalid"
        }
    }

    public var error: ILSError {
        ILSError(code, reason)
    }
}
