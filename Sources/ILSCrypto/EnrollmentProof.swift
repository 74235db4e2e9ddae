public import ILSCore

/// Proof that an enrolling client holds the private key whose public half it asks the controller to certify: an
/// Ed25519 signature over `"ils-enroll-v1\n" + token`, binding the proof to this one token.
public enum EnrollmentProof {
    public static func makeRequest(token: String, keyPair: IdentityKeyPair) -> ControllerAPI.EnrollRequest {
        let message = Array((ControllerAPI.EnrollRequest.proofContext + token).utf8)
        return ControllerAPI.EnrollRequest(
            token: token,
            publicKey: Base64URL.encode(keyPair.publicKey),
            proof: Base64URL.encode(keyPair.sign(message))
        )
    }

    /// The public key the request proves possession of, or a refusal.
    public static func verifiedPublicKey(_ request: ControllerAPI.EnrollRequest) throws(ILSError) -> [UInt8] {
        guard let publicKey = Base64URL.decode(request.publicKey), publicKey.count == 32,
            let proof = Base64URL.decode(request.proof),
            Ed25519.verify(
                proof,
                of: Array((ControllerAPI.EnrollRequest.proofContext + request.token).utf8),
                publicKey: publicKey
            )
        else { throw EnrollmentRefusal.badProof.error }
        return publicKey
    }
}
