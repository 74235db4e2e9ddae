public import Foundation
public import ILSCore
import ILSCrypto
public import NIOCore

/// The device side of enrollment: `enroll(token:)` returns the identity to an app, which stores it itself;
/// `enroll(token:outputPath:force:)` writes it to a file for `ils-gateway enroll`.
///
/// Order matters: everything that can be checked locally is checked before the network is touched; the
/// controller is reached over TLS pinned to the token's CA fingerprint; the token's signature is verified with the
/// key the pinned controller publishes; only then is a key pair made (on this machine) and the token spent. The
/// identity file is written atomically with mode 0600, never over an existing file unless forced.
public enum Enrollment {
    /// A token given on the command line, its `ils-enroll://v1/…` URI (what a QR code carries), or the path of a file
    /// holding either.
    public static func readToken(_ tokenOrFile: String) throws(ILSError) -> String {
        if let token = try EnrollmentURI.token(from: tokenOrFile) { return token }
        if tokenOrFile.split(separator: ".", omittingEmptySubsequences: false).count == 3,
            !FileManager.default.fileExists(atPath: tokenOrFile)
        {
            return tokenOrFile
        }
        guard let attributes = try? FileManager.default.attributesOfItem(atPath: tokenOrFile),
            let size = attributes[.size] as? Int, size <= EnrollmentToken.maximumLength,
            let text = try? String(contentsOfFile: tokenOrFile, encoding: .utf8)
        else {
            throw ILSError(
                .invalidInput,
                "'\(tokenOrFile.prefix(80))' is neither an enrollment token nor a readable token file"
            )
        }
        let trimmed = text.trimmingCharacters(in: .whitespacesAndNewlines)
        return try EnrollmentURI.token(from: trimmed) ?? trimmed
    }

    /// Where the identity file goes when `--out` is not given.
    public static func defaultPath(for name: String, directory: String = "identities") -> String {
        "\(directory)/\(name).json"
    }

    public struct Result: Sendable {
        public let file: IdentityFile
        public let path: String
        /// The PEM files written next to it (`IdentityPEMFiles`), when asked for.
        public let pemPaths: [String]
    }

    /// How much each output file reserves on disk before the token is spent: an identity file is about 2.5 KB and
    /// a PEM file under 1 KB, so a file system with room for this has room for the file, with margin for a longer
    /// CA chain.
    static let reservedBytesPerFile = 16 * 1024

    /// Enrolls with a token that was pasted or scanned and returns the identity to the caller, touching no file:
    /// the app stores it where it wants (an `IdentityStore`: the Keychain, a file). Whitespace around and inside
    /// the token (a line break from a paste, a trailing newline from a scanner) is ignored.
    public static func enroll(token: String, now: Date = Date()) async throws(ILSError) -> IdentityFile {
        try await enroll(token: token, now: now, checkLocally: { _ in }, beforeSpending: {})
    }

    /// `enroll(token:)` with the identity written to a file (0600, atomically, never over an existing file unless
    /// `force`), and PEM copies next to it when `pem`: what `ils-gateway enroll` does. `answerTimeout`, if given,
    /// replaces `ControllerClient`'s 10 s for each of the controller's answers (tests wait as for any event).
    public static func enroll(
        token: String,
        outputPath: String?,
        force: Bool,
        pem: Bool = false,
        now: Date = Date(),
        answerTimeout: TimeAmount? = nil
    )
        async throws(ILSError)
        -> Result
    {
        var path = ""
        var pemPaths: [String] = []
        var outputs: Outputs?
        let file: IdentityFile
        do {
            file = try await enroll(
                token: token,
                now: now,
                answerTimeout: answerTimeout,
                checkLocally: { claims throws(ILSError) in
                    path = outputPath ?? defaultPath(for: claims.ils_name)
                    pemPaths = pem ? IdentityPEMFiles.paths(nextTo: path) : []
                    // Anything at the path counts, a dangling symbolic link too (`attributesOfItem` does not follow
                    // links): the refusal must come before the token is spent, not when the file is written.
                    for output in [path] + pemPaths
                    where !force && (try? FileManager.default.attributesOfItem(atPath: output)) != nil {
                        throw ILSError(
                            .conflict,
                            "\(output) already exists; give --force to replace it or --out for another file"
                        )
                    }
                    // Check now that the file can be written, but create nothing until the controller has said
                    // yes: a refused enrollment leaves no trace on disk.
                    let directory = (path as NSString).deletingLastPathComponent
                    try checkWritable(directory.isEmpty ? "." : directory)
                },
                beforeSpending: { () throws(ILSError) in
                    // Room on disk is checked by taking it: each output's temporary file is made and filled now,
                    // before the token is spent, and the content goes into it afterwards. A full disk refuses here,
                    // with the token intact.
                    outputs = try Outputs.reserve(
                        [path] + pemPaths,
                        in: (path as NSString).deletingLastPathComponent
                    )
                }
            )
        } catch {
            outputs?.abandon()
            throw error
        }
        do {
            try outputs?.commit(
                [try IdentityFileIO.encode(file)] + IdentityPEMFiles.contents(of: file),
                overwrite: force
            )
        } catch {
            throw ILSError(
                error.code,
                "\(error.reason); the token is now used, so ask an admin to run 'admin identity reissue \(file.identity.name)'"
            )
        }
        return Result(file: file, path: path, pemPaths: pemPaths)
    }

    /// A token as pasted or scanned, without the whitespace that came with it; a JWT holds none.
    static func normalized(_ token: String) -> String {
        String(token.unicodeScalars.filter { !CharacterSet.whitespacesAndNewlines.contains($0) }.map(Character.init))
    }

    /// The enrollment itself. Order matters: everything that can be checked locally is checked before the network
    /// is touched (`checkLocally` adds the caller's own checks); the controller is reached over TLS pinned to the
    /// token's CA fingerprint; the token's signature is verified with the key the pinned controller publishes;
    /// only then (after `beforeSpending`) is a key pair made on this machine and the token spent.
    static func enroll(
        token raw: String,
        now: Date,
        answerTimeout: TimeAmount? = nil,
        checkLocally: (EnrollmentToken.Claims) throws(ILSError) -> Void,
        beforeSpending: () throws(ILSError) -> Void
    ) async throws(ILSError) -> IdentityFile {
        guard raw.utf8.count <= 4 * EnrollmentToken.maximumLength else { throw EnrollmentRefusal.malformedToken.error }
        // A scanned QR code gives the URI (`ils-enroll://v1/<token>`); a paste gives the token itself.
        let text = normalized(raw)
        let token = try EnrollmentURI.token(from: text) ?? text
        let parsed = try EnrollmentToken.parse(token)
        let claims = parsed.claims
        try EnrollmentToken.checkExpiry(claims, now: Int64(now.timeIntervalSince1970))
        try IdentityName.validate(claims.ils_name)
        try checkLocally(claims)
        let address: ControllerAddress
        do {
            address = try ControllerAddress(parsing: claims.iss)
        } catch {
            throw EnrollmentRefusal.malformedToken.error
        }

        var client = ControllerClient(address: address, trust: .pinnedFingerprint(claims.ils_ca))
        if let answerTimeout { client.timeout = answerTimeout }
        let info = try await client.call(ControllerRoutes.enrollInfo)
        guard info.address == claims.iss else { throw EnrollmentRefusal.wrongIssuer.error }
        let caFingerprint = try IdentityCertificateAuthority.fingerprint(pem: info.caCertificate)
        guard caFingerprint == claims.ils_ca else { throw EnrollmentRefusal.caMismatch.error }
        guard let tokenKey = Base64URL.decode(info.tokenKey) else { throw EnrollmentRefusal.badSignature.error }
        _ = try EnrollmentToken.verify(token, publicKey: tokenKey, now: Int64(now.timeIntervalSince1970))

        try beforeSpending()
        let keyPair = IdentityKeyPair.generate()
        let response = try await client.call(
            ControllerRoutes.enroll,
            body: EnrollmentProof.makeRequest(token: token, keyPair: keyPair)
        )
        return try checkedFile(response, keyPair: keyPair, claims: claims)
    }

    /// The identity file for the controller's answer, once it is what the token promised.
    private static func checkedFile(
        _ response: ControllerAPI.EnrollResponse,
        keyPair: IdentityKeyPair,
        claims: EnrollmentToken.Claims
    ) throws(ILSError) -> IdentityFile {
        // What goes into the identity file becomes this identity's trust anchor: it must be the CA the token pinned
        // and the controller the token named, not merely what the controller answered.
        guard try IdentityCertificateAuthority.fingerprint(pem: response.caCertificate) == claims.ils_ca else {
            throw EnrollmentRefusal.caMismatch.error
        }
        guard response.controller == claims.iss else { throw EnrollmentRefusal.wrongIssuer.error }
        let certificate = try IdentityCertificate(pem: response.certificate)
        guard certificate.publicKey == keyPair.publicKey, certificate.id == claims.sub else {
            throw ILSError(.unavailable, "the controller returned a certificate for a different key or identity")
        }
        return IdentityFile(
            controller: response.controller,
            identity: response.identity,
            certificate: response.certificate,
            caCertificate: response.caCertificate,
            privateKey: keyPair.privateKeyPEM,
            // The replicas are trusted no further than the CA the token pinned: each must present a certificate from
            // it for its own address when dialled.
            controllers: ControllerAddress.replicas([response.controller] + (response.controllers ?? [])).map(
                \.description
            )
        )
    }
}

extension Enrollment {
    /// The files an enrollment will write, reserved on disk before the token is spent
    /// (`SecureFile.reserve`), with the directories made for them, so that a refusal can undo both.
    struct Outputs {
        private let reservations: [SecureFile.Reservation]
        /// Directories this enrollment created, deepest first.
        private let createdDirectories: [String]

        static func reserve(_ paths: [String], in directory: String) throws(ILSError) -> Outputs {
            var missing: [String] = []
            var candidate = directory
            while !candidate.isEmpty, candidate != "/", !FileManager.default.fileExists(atPath: candidate) {
                missing.append(candidate)
                candidate = (candidate as NSString).deletingLastPathComponent
            }
            if !directory.isEmpty { try SecureFile.createPrivateDirectory(directory) }
            var reservations: [SecureFile.Reservation] = []
            do throws(ILSError) {
                for path in paths {
                    reservations.append(try SecureFile.reserve(path, bytes: Enrollment.reservedBytesPerFile))
                }
            } catch {
                Outputs(reservations: reservations, createdDirectories: missing).abandon()
                throw ILSError(
                    error.code,
                    "\(error.reason); nothing was written and the token was not used: make room and enroll again"
                )
            }
            return Outputs(reservations: reservations, createdDirectories: missing)
        }

        private init(reservations: [SecureFile.Reservation], createdDirectories: [String]) {
            self.reservations = reservations
            self.createdDirectories = createdDirectories
        }

        func commit(_ contents: [Data], overwrite: Bool) throws(ILSError) {
            for (reservation, data) in zip(reservations, contents) {
                do {
                    try reservation.commit(data, overwrite: overwrite)
                } catch {
                    abandon()
                    throw error
                }
            }
        }

        /// Removes every temporary file and the directories made for them (only if still empty).
        func abandon() {
            for reservation in reservations { reservation.abandon() }
            for directory in createdDirectories { rmdir(directory) }
        }
    }
}

extension Enrollment {
    /// The nearest existing ancestor of `directory` must be a writable directory.
    static func checkWritable(_ directory: String) throws(ILSError) {
        var candidate = directory
        while !FileManager.default.fileExists(atPath: candidate) {
            let parent = (candidate as NSString).deletingLastPathComponent
            if parent.isEmpty || parent == candidate {
                candidate = "."
                break
            }
            candidate = parent
        }
        guard FileManager.default.isWritableFile(atPath: candidate) else {
            throw ILSError(.cannotWrite, "cannot write an identity file under \(candidate)")
        }
    }
}

enum IdentityCertificateAuthority {
    static func fingerprint(pem: String) throws(ILSError) -> String {
        let lines = pem.split(whereSeparator: \.isNewline).filter { !$0.hasPrefix("-----") }
        guard let der = Data(base64Encoded: lines.joined()) else {
            throw EnrollmentRefusal.caMismatch.error
        }
        return Fingerprint.sha256(Array(der))
    }
}
