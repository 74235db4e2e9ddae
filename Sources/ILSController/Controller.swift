import Foundation
public import ILSCore
import ILSCrypto
import ILSStore

/// The controller's decisions, independent of the transport: enrollment and the admin API.
///
/// What the data path asks (who is this connection, may it still open a circuit) is answered from memory
/// (`IdentityDirectory`) and is synchronous; what writes the store is `async` and applies the stored result to
/// the directory before it returns.
///
/// Every enrollment rule is enforced here, on the controller, whatever the client already checked: signature and
/// algorithm, expiry, issuer, CA pin, a token the store knows and has not consumed, and proof of key possession.
public struct Controller: Sendable {
    public let state: ControllerState

    public init(state: ControllerState) {
        self.state = state
    }

    public var enrollInfo: ControllerAPI.EnrollInfo {
        ControllerAPI.EnrollInfo(
            address: state.address.description,
            caCertificate: state.authority.certificatePEM,
            tokenKey: Base64URL.encode(state.tokenKey.publicKey)
        )
    }

    /// `POST /v1/enroll`. Nothing is written unless every check passes; the token is consumed in the same store
    /// transaction that binds the certificate, so of two racing enrollments exactly one wins.
    public func enroll(_ request: ControllerAPI.EnrollRequest, now: Int64) async throws(ILSError)
        -> ControllerAPI.EnrollResponse
    {
        let claims = try EnrollmentToken.verify(request.token, publicKey: state.tokenKey.publicKey, now: now)
        // A token names the controller that made it; any replica sharing its store may take it (the store
        // consumes it once, whichever one does).
        if claims.iss != state.address.description {
            let cluster = (try? await controllers().map(\.address)) ?? []
            guard cluster.contains(claims.iss) else { throw EnrollmentRefusal.wrongIssuer.error }
        }
        guard claims.ils_ca == state.authority.fingerprint else { throw EnrollmentRefusal.caMismatch.error }
        let publicKey = try EnrollmentProof.verifiedPublicKey(request)
        // The store, not the directory: the identity may have been made a moment ago through another controller.
        guard let identity = try await state.store.identity(id: claims.sub) else {
            throw EnrollmentRefusal.unknown.error
        }
        guard identity.state != .revoked else {
            throw ILSError(.permissionDenied, "identity '\(identity.name)' is revoked; create a new identity")
        }
        let issued = try issueCertificate(publicKey: publicKey, identity: identity, now: now)
        let record = try await state.store.consumeToken(
            jti: claims.jti,
            identityID: identity.id,
            now: now,
            certificate: EnrolledCertificate(
                fingerprint: issued.fingerprint,
                notAfter: issued.notAfter,
                publicKey: Base64URL.encode(publicKey)
            )
        )
        state.identities.apply(record)
        return ControllerAPI.EnrollResponse(
            identity: record,
            certificate: issued.pem,
            caCertificate: state.authority.certificatePEM,
            controller: state.address.description,
            controllers: await controllerAddresses()
        )
    }

    /// `POST /v1/renew`: a new certificate for a new key, for an active identity presenting its current
    /// certificate. Nothing changes unless the proof verifies and the presented certificate is still current.
    public func renew(_ request: ControllerAPI.RenewRequest, certificateDER: [UInt8]?, now: Int64)
        async throws(ILSError) -> ControllerAPI.EnrollResponse
    {
        guard let certificateDER else { throw ILSError(.permissionDenied, "renewal needs the current certificate") }
        let presented = try IdentityCertificate(der: certificateDER)
        let identity = try await authenticateLearning(
            certificateDER: certificateDER,
            role: presented.role,
            purpose: "renewal"
        )
        guard let publicKey = Base64URL.decode(request.publicKey), publicKey.count == 32,
            let proof = Base64URL.decode(request.proof),
            Ed25519.verify(
                proof,
                of: Array((ControllerAPI.RenewRequest.proofContext + presented.fingerprint).utf8),
                publicKey: publicKey
            )
        else { throw EnrollmentRefusal.badProof.error }
        let issued = try issueCertificate(publicKey: publicKey, identity: identity, now: now)
        let record = try await state.store.renewCertificate(
            id: identity.id,
            previousFingerprint: presented.fingerprint,
            certificate: EnrolledCertificate(
                fingerprint: issued.fingerprint,
                notAfter: issued.notAfter,
                publicKey: Base64URL.encode(publicKey)
            ),
            now: now
        )
        state.identities.apply(record)
        return ControllerAPI.EnrollResponse(
            identity: record,
            certificate: issued.pem,
            caCertificate: state.authority.certificatePEM,
            controller: state.address.description,
            controllers: await controllerAddresses()
        )
    }

    private func issueCertificate(publicKey: [UInt8], identity: IdentityRecord, now: Int64) throws(ILSError)
        -> IssuedCertificate
    {
        do {
            return try state.authority.issueIdentityCertificate(
                publicKey: publicKey,
                identity: identity,
                now: Date(timeIntervalSince1970: TimeInterval(now))
            )
        } catch {
            throw ILSError(.internalError, "could not issue the certificate", detail: "\(error)")
        }
    }

    /// Records a refused enrollment in the audit log (the reason code only; never the token). The caller has no
    /// credentials, so the rows are aggregated per source and code (`RefusalAggregator`). Returns whether it was
    /// the first of its source and code in the window.
    @discardableResult
    public func auditRefusedEnrollment(_ error: ILSError, peer: String, now: Int64) -> Bool {
        state.refusals.record(
            source: peer,
            code: error.code.name,
            now: now,
            action: Self.enrollRefused,
            queue: state.auditQueue
        )
    }

    /// Writes the refusal counts not yet in the audit log, and every row queued before them (before the log is read;
    /// and in the background).
    public func flushRefusals() async {
        state.refusals.drain(action: Self.enrollRefused, queue: state.auditQueue)
        await state.auditQueue.flush()
    }

    static let enrollRefused = "enroll.refused"

    /// Who is calling the admin API: the identity whose *current* certificate was presented, if it is an active
    /// admin. A certificate replaced by `reissue`, or of a deleted, disabled or revoked identity, is refused.
    ///
    /// The TLS layer already verified the chain to our CA; this adds what only the store knows.
    public func authenticateAdmin(certificateDER: [UInt8]?) async throws(ILSError) -> IdentityRecord {
        try await authenticateLearning(certificateDER: certificateDER, role: .admin, purpose: "the admin API")
    }

    /// `authenticate`, for callers that may wait: a certificate the directory does not know yet is first looked up
    /// in the store. With several controllers, a device enrolled or renewed through another one can connect here
    /// before that controller's change notification arrives; without this it would be refused until then.
    public func authenticateLearning(certificateDER: [UInt8]?, role: IdentityRole, purpose: String)
        async throws(ILSError) -> IdentityRecord
    {
        await learnIfUnknown(certificateDER: certificateDER)
        return try authenticate(certificateDER: certificateDER, role: role, purpose: purpose)
    }

    /// Whether the directory holds no identity whose current certificate is this one (a certificate we cannot
    /// parse is not worth a store read: `authenticate` refuses it).
    func directoryMisses(certificateDER: [UInt8]?) -> IdentityCertificate? {
        guard let certificateDER, let presented = try? IdentityCertificate(der: certificateDER) else { return nil }
        let known = state.identities.identity(id: presented.id)?.certificateFingerprint
        return known == presented.fingerprint ? nil : presented
    }

    /// Reads the presented certificate's identity from the store if the directory misses it. The chain to our CA is
    /// already verified, so only our own certificates (current, replaced or of deleted identities) get here, and
    /// connections are capped before TLS: the store sees at most one bounded read per such connection. A store
    /// that cannot answer leaves the directory as it was, and `authenticate` answers from it.
    func learnIfUnknown(certificateDER: [UInt8]?) async {
        guard let presented = directoryMisses(certificateDER: certificateDER) else { return }
        _ = try? await state.identities.refresh(id: presented.id, from: state.store)
    }

    /// The active identity with this current certificate and role, or a refusal that says why.
    public func authenticate(certificateDER: [UInt8]?, role: IdentityRole, purpose: String) throws(ILSError)
        -> IdentityRecord
    {
        guard let certificateDER else {
            throw ILSError(.permissionDenied, "\(purpose) needs a \(role.rawValue) identity's client certificate")
        }
        let presented = try IdentityCertificate(der: certificateDER)
        let identity = try activeIdentity(id: presented.id, fingerprint: presented.fingerprint)
        state.identities.noteSeen(id: identity.id, at: Int64(Date().timeIntervalSince1970))
        guard identity.role == role else {
            throw ILSError(
                .permissionDenied,
                "identity '\(identity.name)' has role \(identity.role.rawValue), not \(role.rawValue)"
            )
        }
        return identity
    }

    /// The identity as the directory has it now, if it is active and `fingerprint` is still its current certificate;
    /// otherwise a `permissionDenied` refusal that says why (revoked, disabled, or a certificate that was replaced or
    /// whose identity was deleted). Connections are checked with it when they are made, circuits when they are
    /// opened, so a device hears the same reason either way.
    public func activeIdentity(id: String, fingerprint: String?) throws(ILSError) -> IdentityRecord {
        // Memory only: this runs on event loops, for every connection and circuit.
        guard let identity = state.identities.identity(id: id), let fingerprint,
            identity.certificateFingerprint == fingerprint
        else { throw ILSError(.permissionDenied, "this identity certificate is no longer valid") }
        let current = state.unsavedBlocks.block(id: id)?.state ?? identity.state
        guard current == .active else {
            throw ILSError(.permissionDenied, "identity '\(identity.name)' is \(current.rawValue)")
        }
        return identity
    }

    public func createIdentity(_ request: ControllerAPI.CreateIdentityRequest, actor: String) async throws(ILSError)
        -> ControllerAPI.TokenResponse
    {
        try IdentityName.validate(request.name)
        try Self.validateAttributes(request.attributes)
        let now = Int64(Date().timeIntervalSince1970)
        let identity = IdentityRecord(
            id: UUID().uuidString.lowercased(),
            name: request.name,
            role: request.role,
            attributes: request.attributes,
            state: .pending,
            createdAt: now
        )
        try checkGrantRoom(for: identity)
        let (token, record) = try makeToken(for: identity, lifetime: request.tokenLifetimeSeconds, now: now)
        try await state.store.createIdentity(identity, token: record, actor: actor)
        state.identities.apply(identity)
        return ControllerAPI.TokenResponse(identity: identity, token: token, expiresAt: record.expiresAt)
    }

    public func reissue(name: String, lifetime: Int64, actor: String) async throws(ILSError)
        -> ControllerAPI.TokenResponse
    {
        guard let identity = try await state.store.identity(named: name) else {
            throw ILSError(.notFound, "no identity named '\(name)'")
        }
        guard identity.state != .revoked else {
            throw ILSError(.conflict, "identity '\(name)' is revoked; create a new identity instead")
        }
        let now = Int64(Date().timeIntervalSince1970)
        let (token, record) = try makeToken(for: identity, lifetime: lifetime, now: now)
        try await state.store.replaceToken(record, actor: actor)
        return ControllerAPI.TokenResponse(identity: identity, token: token, expiresAt: record.expiresAt)
    }

    /// Ids of identities that must not get in anywhere: revoked or disabled, in the store or only in memory.
    public func blockedIdentityIDs() -> [String] {
        Array(state.identities.blockedIDs.union(state.unsavedBlocks.all.map(\.id))).sorted()
    }

    /// What a state change did: saved in the store, or (a revocation or disablement the store could not write)
    /// in force on this controller only, with the store's error.
    public enum StateChange: Sendable {
        case saved(IdentityRecord)
        case unsaved(IdentityRecord, ILSError)

        public var record: IdentityRecord {
            switch self {
            case .saved(let record), .unsaved(let record, _): return record
            }
        }
    }

    /// Revokes, disables or enables an identity in one store transaction. Revoked is final.
    ///
    /// A block must take effect even when the store cannot be written (a full disk under the state directory): if
    /// the transaction fails for a revocation or disablement that the store's current state allows, the block is
    /// kept in memory (`UnsavedBlocks`) and the caller closes the connections and pushes it all the same.
    public func changeState(name: String, to target: IdentityState, actor: String) async throws(ILSError)
        -> StateChange
    {
        do {
            let record = try await state.store.changeState(named: name, to: target, actor: actor)
            state.identities.apply(record)
            state.unsavedBlocks.remove(id: record.id)
            return .saved(record)
        } catch {
            // The directory when the store cannot even be read: a block must hold with the store down too.
            let stored: IdentityRecord?
            do throws(ILSError) {
                stored = try await state.store.identity(named: name)
            } catch let readError {
                guard readError.code == .unavailable || readError.code == .internalError else { throw error }
                stored = state.identities.identity(named: name)
            }
            guard let stored else { throw error }
            let unsaved = state.unsavedBlocks.block(id: stored.id)
            if target == .active, unsaved?.state == .disabled, stored.state == .active {
                // Enabling what only memory disabled: the store already says active.
                state.unsavedBlocks.remove(id: stored.id)
                return .saved(stored)
            }
            guard target != .active, error.code == .internalError || error.code == .unavailable,
                stored.state != .revoked
            else { throw error }
            state.unsavedBlocks.add(id: stored.id, name: stored.name, state: target, actor: actor)
            var record = stored
            record.state = target
            return .unsaved(record, error)
        }
    }

    /// Tries again to save the blocks only this controller knows; returns how many are still unsaved.
    @discardableResult
    public func saveUnsavedBlocks() async -> Int {
        for block in state.unsavedBlocks.all {
            let saved = try? await state.store.changeState(named: block.name, to: block.state, actor: block.actor)
            if let saved { state.identities.apply(saved) }
            // Saved now, or no longer needed: the identity was deleted, or the store has the block already.
            let gone: Bool
            do throws(ILSError) {
                let stored = try await state.store.identity(id: block.id)
                gone = stored == nil || stored?.state == block.state
            } catch {
                gone = false
            }
            if saved != nil || gone {
                state.unsavedBlocks.remove(id: block.id)
            }
        }
        return state.unsavedBlocks.all.count
    }

    public func identity(named name: String) async throws(ILSError) -> IdentityRecord {
        guard let identity = try await state.store.identity(named: name) else {
            throw ILSError(.notFound, "no identity named '\(name)'")
        }
        return identity
    }

    /// Deletes the identity; returns the record it had.
    @discardableResult
    public func deleteIdentity(named name: String, actor: String) async throws(ILSError) -> IdentityRecord {
        guard let deleted = try await state.store.deleteIdentity(named: name, actor: actor) else {
            throw ILSError(.notFound, "no identity named '\(name)'")
        }
        state.identities.remove(id: deleted.id)
        return deleted
    }

    /// The controllers sharing this one's store that sent a heartbeat in the last `ControllerHeartbeat.window`,
    /// this one always among them, by address.
    public func controllers(now: Int64? = nil) async throws(ILSError) -> [ControllerAPI.ControllerInfo] {
        let now = now ?? Int64(Date().timeIntervalSince1970)
        let members = try await state.store.controllers(seenSince: now - ControllerHeartbeat.window)
        var listed = members
        if !listed.contains(where: { $0.address == state.address.description }) {
            listed.append(.init(address: state.address.description, startedAt: now, lastSeenAt: now))
        }
        return listed.sorted { $0.address < $1.address }
    }

    /// Every listed controller's address, this one's first, as enrollment, renewal and gateway links hand it out.
    /// Only this one's when the store cannot be read: the answer must not fail for want of the list.
    public func controllerAddresses() async -> [String] {
        (try? await listedControllerAddresses()) ?? [state.address.description]
    }

    /// This controller's address, then the others with a heartbeat in the store; throws when the store cannot say.
    func listedControllerAddresses() async throws(ILSError) -> [String] {
        let own = state.address.description
        return [own] + (try await controllers()).map(\.address).filter { $0 != own }
    }

    /// `POST /v1/admin/cluster/join`: the cluster's secrets for a new replica at `request.address`, sealed to its
    /// one-time key, with an audit row. Refused on a SQLite store, which only one controller may use.
    public func join(_ request: ControllerAPI.JoinRequest, actor: String) async throws(ILSError)
        -> ControllerAPI.JoinResponse
    {
        guard state.store is SQLiteControllerStore == false else {
            throw ILSError(
                .conflict,
                "this controller's store is SQLite, which one controller uses alone; move it to PostgreSQL first "
                    + "(ils-gateway controller migrate), then join replicas"
            )
        }
        let address = try ControllerAddress(parsing: request.address)
        guard let publicKey = Base64URL.decode(request.publicKey), publicKey.count == 32 else {
            throw ILSError(.invalidArgument, "publicKey must be 32 bytes of base64url (X25519)")
        }
        let secrets = ControllerSecrets(caKey: state.authority.privateKeyPEM, tokenKey: state.tokenKey.privateKeyPEM)
        let sealed = try secrets.sealed(to: publicKey, context: address.description)
        try await state.store.audit(
            actor: actor,
            action: "controller.join",
            target: address.description,
            detail: "secrets sealed to key \(Fingerprint.sha256(publicKey).prefix(16))"
        )
        return ControllerAPI.JoinResponse(
            caCertificate: state.authority.certificatePEM,
            encapsulatedKey: Base64URL.encode(sealed.encapsulatedKey),
            sealedSecrets: Base64URL.encode(sealed.ciphertext)
        )
    }

    private func makeToken(for identity: IdentityRecord, lifetime: Int64, now: Int64) throws(ILSError)
        -> (String, TokenRecord)
    {
        guard lifetime > 0, lifetime <= 365 * 86400 else {
            throw ILSError(.invalidArgument, "a token's lifetime must be between 1 second and 365 days")
        }
        let jti = Base64URL.encode(SecureRandom.bytes(16))
        let claims = EnrollmentToken.Claims(
            iss: state.address.description,
            sub: identity.id,
            jti: jti,
            iat: now,
            exp: now + lifetime,
            caFingerprint: state.authority.fingerprint,
            name: identity.name,
            role: identity.role
        )
        let token = EnrollmentToken.sign(claims, seed: state.tokenKey.seedForSigning)
        return (token, TokenRecord(jti: jti, identityID: identity.id, createdAt: now, expiresAt: now + lifetime))
    }
}
