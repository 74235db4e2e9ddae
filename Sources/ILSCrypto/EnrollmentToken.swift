import Foundation
public import ILSCore

/// The one-time enrollment token: a JWS compact serialisation (RFC 7515) of a JWT (RFC 7519), signed with EdDSA
/// over Ed25519 (RFC 8037), and nothing else.
///
/// Written here rather than taken from a general JWT library so that every refusal the product promises (`alg:
/// none`, any other algorithm, a tampered payload, a bad signature, expiry) maps to exactly one stable code, and so
/// the only algorithm that can ever verify is the one we issue.
public enum EnrollmentToken {
    /// The claims. `ils_ca` pins the controller: the SHA-256 of the CA certificate's DER, lowercase hex.
    public struct Claims: Codable, Sendable, Equatable {
        public var iss: String
        public var sub: String
        public var jti: String
        public var iat: Int64
        public var exp: Int64
        public var ils_ca: String
        /// For display by `enroll`; the controller trusts its store, not these.
        public var ils_name: String
        public var ils_role: IdentityRole

        public init(
            iss: String,
            sub: String,
            jti: String,
            iat: Int64,
            exp: Int64,
            caFingerprint: String,
            name: String,
            role: IdentityRole
        ) {
            self.iss = iss
            self.sub = sub
            self.jti = jti
            self.iat = iat
            self.exp = exp
            self.ils_ca = caFingerprint
            self.ils_name = name
            self.ils_role = role
        }
    }

    /// A token split into its parts, not yet verified.
    public struct Parsed: Sendable {
        public let claims: Claims
        let signingInput: [UInt8]
        let signature: [UInt8]
    }

    private struct Header: Codable {
        var alg: String
        var typ: String?
    }

    /// The longest token accepted: real ones are about 500 bytes; the bound keeps hostile input cheap.
    public static let maximumLength = 4096

    /// Signs `claims` with the controller's token key (an Ed25519 seed).
    public static func sign(_ claims: Claims, seed: [UInt8]) -> String {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys]
        let header = Base64URL.encode(Array(#"{"alg":"EdDSA","typ":"JWT"}"#.utf8))
        let payload = Base64URL.encode(Array((try? encoder.encode(claims)) ?? Data()))
        let signingInput = "\(header).\(payload)"
        let signature = Ed25519.sign(Array(signingInput.utf8), seed: seed)
        return "\(signingInput).\(Base64URL.encode(signature))"
    }

    /// Splits and decodes a token, refusing anything that is not an EdDSA JWS with the expected claims. Does not
    /// check the signature or expiry: see `verify`.
    public static func parse(_ token: String) throws(ILSError) -> Parsed {
        let trimmed = token.trimmingCharacters(in: .whitespacesAndNewlines)
        guard trimmed.utf8.count <= maximumLength else { throw EnrollmentRefusal.malformedToken.error }
        let parts = trimmed.split(separator: ".", omittingEmptySubsequences: false)
        guard parts.count == 3, let headerBytes = Base64URL.decode(parts[0]),
            let header = try? JSONDecoder().decode(Header.self, from: Data(headerBytes))
        else { throw EnrollmentRefusal.malformedToken.error }
        // RFC 8725 §3.1: the algorithm is fixed by us, never chosen by the token. This refuses "none" too.
        guard header.alg == "EdDSA" else { throw EnrollmentRefusal.unsupportedAlgorithm.error }
        guard let payloadBytes = Base64URL.decode(parts[1]),
            let claims = try? JSONDecoder().decode(Claims.self, from: Data(payloadBytes))
        else { throw EnrollmentRefusal.malformedToken.error }
        guard let signature = Base64URL.decode(parts[2]), signature.count == 64 else {
            throw EnrollmentRefusal.badSignature.error
        }
        return Parsed(claims: claims, signingInput: Array("\(parts[0]).\(parts[1])".utf8), signature: signature)
    }

    /// Parses and verifies: signature by `publicKey`, then expiry against `now` (Unix seconds).
    public static func verify(_ token: String, publicKey: [UInt8], now: Int64) throws(ILSError) -> Claims {
        let parsed = try parse(token)
        guard Ed25519.verify(parsed.signature, of: parsed.signingInput, publicKey: publicKey) else {
            throw EnrollmentRefusal.badSignature.error
        }
        try checkExpiry(parsed.claims, now: now)
        return parsed.claims
    }

    public static func checkExpiry(_ claims: Claims, now: Int64) throws(ILSError) {
        guard now < claims.exp else { throw EnrollmentRefusal.expired.error }
    }
}
