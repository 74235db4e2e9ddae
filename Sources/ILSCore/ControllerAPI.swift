/// The JSON bodies of the controller's HTTPS API (docs/protocol.md, "Controller API"). Field names are API.
public enum ControllerAPI {
    /// `GET /v1/enroll/info`: what a device needs to check its token, fetched over TLS pinned to the CA fingerprint
    /// the token carries.
    public struct EnrollInfo: Codable, Sendable {
        /// The controller's URL, which a token's `iss` must equal.
        public var address: String
        /// The controller CA certificate, PEM.
        public var caCertificate: String
        /// The controller's enrollment-token verification key: Ed25519, 32 bytes, base64url without padding.
        public var tokenKey: String

        public init(address: String, caCertificate: String, tokenKey: String) {
            self.address = address
            self.caCertificate = caCertificate
            self.tokenKey = tokenKey
        }
    }

    /// `POST /v1/enroll`.
    public struct EnrollRequest: Codable, Sendable {
        /// The one-time enrollment JWT, as issued.
        public var token: String
        /// The new identity's Ed25519 public key, base64url without padding.
        public var publicKey: String
        /// Proof of possession: the Ed25519 signature, by the new key, of `"ils-enroll-v1\n" + token`,
        /// base64url without padding.
        public var proof: String

        public init(token: String, publicKey: String, proof: String) {
            self.token = token
            self.publicKey = publicKey
            self.proof = proof
        }

        public static let proofContext = "ils-enroll-v1\n"
    }

    /// `POST /v1/renew`, over mTLS with the identity's current certificate: a new key for a new certificate,
    /// without a token. `proof` signs `"ils-renew-v1\n" + <current certificate fingerprint>` with the new key.
    public struct RenewRequest: Codable, Sendable {
        public var publicKey: String
        public var proof: String

        public init(publicKey: String, proof: String) {
            self.publicKey = publicKey
            self.proof = proof
        }

        public static let proofContext = "ils-renew-v1\n"
    }

    public struct EnrollResponse: Codable, Sendable {
        public var identity: IdentityRecord
        /// The identity's certificate, PEM.
        public var certificate: String
        /// The CA chain to trust, PEM.
        public var caCertificate: String
        public var controller: String
        /// Every controller replica's address, the answering one first, for the identity file: a device fails over
        /// to the next when one is down, a gateway links to all of them. Absent from controllers of earlier releases.
        public var controllers: [String]?

        public init(
            identity: IdentityRecord,
            certificate: String,
            caCertificate: String,
            controller: String,
            controllers: [String]? = nil
        ) {
            self.identity = identity
            self.certificate = certificate
            self.caCertificate = caCertificate
            self.controller = controller
            self.controllers = controllers
        }
    }

    /// `POST /v1/admin/identities`.
    public struct CreateIdentityRequest: Codable, Sendable {
        public var name: String
        public var role: IdentityRole
        public var attributes: [String]
        /// Token lifetime in seconds.
        public var tokenLifetimeSeconds: Int64

        public init(name: String, role: IdentityRole, attributes: [String], tokenLifetimeSeconds: Int64) {
            self.name = name
            self.role = role
            self.attributes = attributes
            self.tokenLifetimeSeconds = tokenLifetimeSeconds
        }
    }

    /// `POST /v1/admin/identities/NAME/reissue`.
    public struct ReissueRequest: Codable, Sendable {
        public var tokenLifetimeSeconds: Int64

        public init(tokenLifetimeSeconds: Int64) {
            self.tokenLifetimeSeconds = tokenLifetimeSeconds
        }
    }

    /// `POST /v1/admin/cluster/join` (admin only): a new controller replica asks for the cluster's secrets, the CA
    /// key and the token-signing key, for `address`. They come back sealed to `publicKey` (HPKE, `ControllerSecrets`),
    /// so they are never in the clear outside the two controllers' memory, even inside the TLS connection.
    public struct JoinRequest: Codable, Sendable {
        /// The replica's own `https://HOST:PORT`.
        public var address: String
        /// The replica's one-time X25519 public key, base64url (32 bytes).
        public var publicKey: String

        public init(address: String, publicKey: String) {
            self.address = address
            self.publicKey = publicKey
        }
    }

    /// Answer to `JoinRequest`.
    public struct JoinResponse: Codable, Sendable {
        public var caCertificate: String
        /// HPKE's encapsulated key, base64url.
        public var encapsulatedKey: String
        /// The sealed `ControllerSecrets`, base64url.
        public var sealedSecrets: String

        public init(caCertificate: String, encapsulatedKey: String, sealedSecrets: String) {
            self.caCertificate = caCertificate
            self.encapsulatedKey = encapsulatedKey
            self.sealedSecrets = sealedSecrets
        }
    }

    /// A controller replica sharing the store, as `GET /v1/controllers` lists them.
    public struct ControllerInfo: Codable, Sendable, Hashable {
        public var address: String
        public var startedAt: Int64
        public var lastSeenAt: Int64

        public init(address: String, startedAt: Int64, lastSeenAt: Int64) {
            self.address = address
            self.startedAt = startedAt
            self.lastSeenAt = lastSeenAt
        }
    }

    /// Answer to create and reissue: the identity and its one-time enrollment token.
    public struct TokenResponse: Codable, Sendable {
        public var identity: IdentityRecord
        public var token: String
        public var expiresAt: Int64

        public init(identity: IdentityRecord, token: String, expiresAt: Int64) {
            self.identity = identity
            self.token = token
            self.expiresAt = expiresAt
        }
    }

    /// `GET /v1/admin/sessions`: one live circuit.
    public struct Session: Codable, Sendable, Hashable {
        public var id: String
        public var device: String
        public var deviceID: String
        public var service: String
        public var gateway: String
        public var startedAt: Int64
        /// Ciphertext bytes relayed from the device to the gateway, and back.
        public var bytesFromDevice: Int
        public var bytesToDevice: Int
        /// The controller relaying the circuit (its address); nil from controllers of earlier releases.
        public var controller: String?

        public init(
            id: String,
            device: String,
            deviceID: String,
            service: String,
            gateway: String,
            startedAt: Int64,
            bytesFromDevice: Int,
            bytesToDevice: Int,
            controller: String? = nil
        ) {
            self.controller = controller
            self.id = id
            self.device = device
            self.deviceID = deviceID
            self.service = service
            self.gateway = gateway
            self.startedAt = startedAt
            self.bytesFromDevice = bytesFromDevice
            self.bytesToDevice = bytesToDevice
        }
    }

    /// One audit log entry. `seq` grows with every entry and is the cursor for paging (`before`).
    public struct AuditEntry: Codable, Sendable, Hashable {
        public var seq: Int64
        /// UNIX seconds.
        public var at: Int64
        public var actor: String
        public var action: String
        public var target: String
        public var detail: String

        public init(seq: Int64, at: Int64, actor: String, action: String, target: String, detail: String) {
            self.seq = seq
            self.at = at
            self.actor = actor
            self.action = action
            self.target = target
            self.detail = detail
        }
    }

    /// Which audit entries a page holds besides its time and `seq` bounds (`actor=`, `action=`, `target=` of
    /// `GET /v1/admin/audit`). Each set field must match exactly, except an `action` ending in "." which matches every
    /// action it starts (`identity.` is every identity action). A field is at most `maximumLength` characters of visible
    /// text: it is refused before it reaches the store.
    public struct AuditFilter: Sendable, Hashable {
        public var actor: String?
        public var action: String?
        public var target: String?

        public init(actor: String? = nil, action: String? = nil, target: String? = nil) {
            self.actor = actor
            self.action = action
            self.target = target
        }

        public static let maximumLength = 128

        /// The action to match exactly, or nil when `action` is a prefix (or unset).
        public var exactAction: String? { action.flatMap { $0.hasSuffix(".") ? nil : $0 } }
        /// The prefix `action` names when it ends in ".".
        public var actionPrefix: String? { action.flatMap { $0.hasSuffix(".") ? $0 : nil } }

        /// The set fields as query items (`ControllerClient.call`'s `query`).
        public var queryItems: [(String, String)] {
            [("actor", actor), ("action", action), ("target", target)].compactMap { name, value in
                value.map { (name, $0) }
            }
        }

        /// The set fields as query parameters, each starting with "&" (`&action=identity.revoke`), percent-encoded
        /// but for RFC 3986's unreserved characters. Empty when nothing is set.
        public var queryParameters: String {
            queryItems.map { "&\($0)=\(ControllerEndpoint.percentEncoded($1))" }.joined()
        }

        /// The filter a query string names; `.invalidArgument` for an empty, over-long or control-character value.
        public init(query: [String: String]) throws(ILSError) {
            func field(_ name: String) throws(ILSError) -> String? {
                guard let value = query[name] else { return nil }
                // Characters, as the store bounds what it keeps (`AuditLimits.field`): a field it cut to 128
                // characters ending in "…" can still be asked for.
                guard !value.isEmpty, value.unicodeScalars.count <= Self.maximumLength,
                    !value.unicodeScalars.contains(where: ControlCharacters.isControl)
                else {
                    throw ILSError(
                        .invalidArgument,
                        "'\(name)' must be 1-\(Self.maximumLength) characters of visible text"
                    )
                }
                return value
            }
            self.init(actor: try field("actor"), action: try field("action"), target: try field("target"))
        }
    }

    /// `GET /v1/admin/audit?since=UNIX&before=SEQ&limit=N`: the newest `limit` entries (default and maximum
    /// `maximumLimit`) at or after `since` with `seq` below `before`, oldest first. `nextBefore` is set when older
    /// entries may remain: pass it as `before` for the next page.
    public struct AuditPage: Codable, Sendable {
        public var entries: [AuditEntry]
        public var nextBefore: Int64?

        public init(entries: [AuditEntry], nextBefore: Int64?) {
            self.entries = entries
            self.nextBefore = nextBefore
        }

        /// The largest page the controller sends (a page of 1,000 long rows is well under a megabyte).
        public static let maximumLimit = 1000
    }

    /// Every refusal: HTTP status plus this body. `code` is API (see `EnrollmentRefusal` and docs/protocol.md).
    public struct ErrorBody: Codable, Sendable, Error {
        public var error: String
        public var code: String

        public init(error: String, code: String) {
            self.error = error
            self.code = code
        }
    }
}

/// The identity file a device, gateway or admin keeps (`identities/NAME.json`, mode 0600). It holds the private
/// key: it never leaves the machine it was made on.
public struct IdentityFile: Codable, Sendable {
    public var version: Int
    public var controller: String
    public var identity: IdentityRecord
    /// The identity certificate, PEM.
    public var certificate: String
    /// The controller CA, PEM.
    public var caCertificate: String
    /// The Ed25519 private key, PKCS#8 PEM.
    public var privateKey: String
    /// Every controller replica the controller named at enrollment or renewal, `controller` first; empty in files
    /// written before replicas (and then not written, so such a file reads the same in an earlier release).
    public var controllers: [String]

    public init(
        controller: String,
        identity: IdentityRecord,
        certificate: String,
        caCertificate: String,
        privateKey: String,
        controllers: [String] = []
    ) {
        self.version = 1
        self.controller = controller
        self.identity = identity
        self.certificate = certificate
        self.caCertificate = caCertificate
        self.privateKey = privateKey
        self.controllers = controllers
    }

    /// This file with `controllers` set to the cluster's list as a controller just named it
    /// (`ControllerAddress.listHeader`), or nil when that would change nothing: the same addresses in any order, or
    /// an empty list. `controller` stays the first tried, even when the list no longer names it.
    public func learning(_ announced: [ControllerAddress]) -> IdentityFile? {
        // Compared with the list the file holds (its `controller` alone when it has none), so a file whose own
        // controller left the cluster is not written again on every connection.
        let known = ControllerAddress.replicas(controllers.isEmpty ? [controller] : controllers)
        guard !announced.isEmpty, Set(announced) != Set(known) else { return nil }
        var file = self
        file.controllers = announced.map(\.description)
        return file
    }

    /// The controllers to try, in order: `controller`, then the others of `controllers`, each once, invalid
    /// addresses left out, at most `ControllerAddress.maximumReplicas` (the list came from the network).
    public var controllerAddresses: [ControllerAddress] {
        ControllerAddress.replicas([controller] + controllers)
    }

    private enum CodingKeys: String, CodingKey {
        case version, controller, identity, certificate, caCertificate, privateKey, controllers
    }

    public func encode(to encoder: any Encoder) throws {
        var container = encoder.container(keyedBy: CodingKeys.self)
        try container.encode(version, forKey: .version)
        try container.encode(controller, forKey: .controller)
        try container.encode(identity, forKey: .identity)
        try container.encode(certificate, forKey: .certificate)
        try container.encode(caCertificate, forKey: .caCertificate)
        try container.encode(privateKey, forKey: .privateKey)
        if !controllers.isEmpty { try container.encode(controllers, forKey: .controllers) }
    }

    /// Reads a file another conforming client may have written: keys in any order, unknown keys ignored (JSON
    /// objects are unordered, and a later version may add keys), and the three PEM values brought to one layout
    /// (`PEMText.canonical`: CRLF, a missing final newline, indentation, other line widths).
    public init(from decoder: any Decoder) throws {
        let container = try decoder.container(keyedBy: CodingKeys.self)
        version = try container.decode(Int.self, forKey: .version)
        controller = try container.decode(String.self, forKey: .controller)
        identity = try container.decode(IdentityRecord.self, forKey: .identity)
        certificate = PEMText.canonical(try container.decode(String.self, forKey: .certificate))
        caCertificate = PEMText.canonical(try container.decode(String.self, forKey: .caCertificate))
        privateKey = PEMText.canonical(try container.decode(String.self, forKey: .privateKey))
        controllers = try container.decodeIfPresent([String].self, forKey: .controllers) ?? []
    }
}
