public import Foundation
public import ILSCore
public import ILSCrypto
public import ILSStore

#if canImport(Glibc)
import Glibc
#endif

/// The controller's state directory: CA, TLS certificate, token key, configuration and the identity store.
///
/// ```
/// DIR/controller.json   address and CA fingerprint
/// DIR/ca.pem, ca.key    the CA (key 0600)
/// DIR/server.pem, .key  TLS certificate for the address, chain includes the CA (key 0600)
/// DIR/token.key         Ed25519 key that signs enrollment tokens (0600)
/// DIR/store.sqlite      identities, tokens, services, audit (WAL mode)
/// ```
public struct ControllerState: Sendable {
    struct Configuration: Codable {
        var version: Int
        var address: String
        var caFingerprint: String
    }

    public let directory: String
    public let address: ControllerAddress
    public let authority: CertificateAuthority
    public let serverCertificatePEM: String
    public let serverKeyPEM: String
    let tokenKey: IdentityKeyPair
    public let store: any ControllerStore
    /// What the data path reads (identities, services), in memory and kept current (shared by every copy).
    public let identities = IdentityDirectory()
    /// Audit rows written from event loops, in order, off them (shared by every copy).
    public let auditQueue: AuditQueue
    /// Unauthenticated refusals, counted so they cannot flood the audit log (shared by every copy of this state).
    public let refusals = RefusalAudit()
    /// Blocks in force that the store could not save yet (shared by every copy of this state).
    public let unsavedBlocks = UnsavedBlocks()
    /// The controller list gateways were last told (shared by every copy of this state).
    public let roster: ControllerRoster

    /// A state whose parts are already in memory. `initialize` and `load` build it from the state directory; the
    /// fuzz targets build it from fixed keys and an in-memory store.
    package init(
        directory: String,
        address: ControllerAddress,
        authority: CertificateAuthority,
        serverCertificatePEM: String,
        serverKeyPEM: String,
        tokenKey: IdentityKeyPair,
        store: any ControllerStore
    ) {
        self.directory = directory
        self.address = address
        self.authority = authority
        self.serverCertificatePEM = serverCertificatePEM
        self.serverKeyPEM = serverKeyPEM
        self.tokenKey = tokenKey
        self.store = store
        self.auditQueue = AuditQueue(store: store)
        self.roster = ControllerRoster(own: address)
    }

    /// A second controller replica of this one in the same process, sharing its CA and token key, and its store
    /// object unless `store` is another (a connection of its own to the same database, with its own change feed),
    /// at `address` with its own TLS certificate, and a directory of its own in memory (for tests: replicas in
    /// production each load their own state directory, made by `controller join`).
    package func replica(
        address: ControllerAddress,
        serverCertificatePEM: String,
        serverKeyPEM: String,
        store replicaStore: (any ControllerStore)? = nil
    ) -> ControllerState {
        ControllerState(
            directory: directory,
            address: address,
            authority: authority,
            serverCertificatePEM: serverCertificatePEM,
            serverKeyPEM: serverKeyPEM,
            tokenKey: tokenKey,
            store: replicaStore ?? store
        )
    }

    /// The default service every fresh controller has: devices dial it, gateways host it.
    public static let defaultService = ServiceRecord(name: "claude-api", dialRoles: [.device], bindRoles: [.gateway])

    /// Creates a state directory and the first admin identity. Refuses to touch an existing, non-empty directory
    /// and to overwrite an existing admin file; on any failure, removes what it created.
    ///
    /// The store is `store` when given (a PostgreSQL store, empty), else a new SQLite file in the directory.
    public static func initialize(
        directory: String,
        address: ControllerAddress,
        adminOut: String,
        store givenStore: (any ControllerStore)? = nil,
        now: Date = Date()
    ) async throws(ILSError) -> ControllerState {
        try refuseNonEmpty(directory)
        let manager = FileManager.default
        if manager.fileExists(atPath: adminOut) {
            throw ILSError(.conflict, "\(adminOut) already exists; choose another --admin-out or move it away")
        }
        let existed = manager.fileExists(atPath: directory)
        try SecureFile.createPrivateDirectory(directory)
        do throws(ILSError) {
            let authority: CertificateAuthority
            let server: (certificatePEM: String, privateKeyPEM: String)
            do {
                authority = try CertificateAuthority.create(name: "ils-gateway controller CA", now: now)
                server = try authority.issueServerCertificate(host: address.host, now: now)
            } catch {
                throw ILSError(.internalError, "could not create the controller CA: \(error)")
            }
            let tokenKey = IdentityKeyPair.generate()
            try writeFiles(
                in: directory,
                address: address,
                authority: authority,
                server: server,
                tokenKeyPEM: tokenKey.privateKeyPEM
            )
            let store: any ControllerStore
            if let givenStore {
                // A store with identities is a cluster's already: a second CA over it would lock every device out.
                guard try await givenStore.identities().isEmpty else {
                    throw ILSError(
                        .conflict,
                        "this store already holds identities: it is another controller's; "
                            + "to add a controller to that cluster, use `controller join`"
                    )
                }
                store = givenStore
            } else {
                store = try SQLiteControllerStore(path: "\(directory)/store.sqlite")
            }
            if try await store.service(named: defaultService.name) == nil {
                try await store.createService(defaultService)
            }
            let state = ControllerState(
                directory: directory,
                address: address,
                authority: authority,
                serverCertificatePEM: server.certificatePEM + "\n" + authority.certificatePEM,
                serverKeyPEM: server.privateKeyPEM,
                tokenKey: tokenKey,
                store: store
            )
            try await state.identities.reload(from: store)
            try await state.bootstrapAdmin(writeTo: adminOut, now: now)
            return state
        } catch {
            discard(directory, existed: existed)
            throw error
        }
    }

    /// Creates the state directory of a new replica of an existing controller: the cluster's CA and token key (from
    /// `controller join`), a TLS certificate for `address` issued here with that CA, and no store of its own (it
    /// shares the cluster's PostgreSQL store). Refuses a directory that is not empty; removes what it wrote on failure.
    public static func initializeReplica(
        directory: String,
        address: ControllerAddress,
        caCertificatePEM: String,
        secrets: ControllerSecrets,
        now: Date = Date()
    ) throws(ILSError) -> Files {
        try refuseNonEmpty(directory)
        let manager = FileManager.default
        let authority: CertificateAuthority
        let server: (certificatePEM: String, privateKeyPEM: String)
        do {
            authority = try CertificateAuthority(certificatePEM: caCertificatePEM, privateKeyPEM: secrets.caKey)
            server = try authority.issueServerCertificate(host: address.host, now: now)
        } catch {
            throw ILSError(.invalidInput, "the cluster's CA could not be loaded from the joined secrets")
        }
        _ = try IdentityKeyPair(privateKeyPEM: secrets.tokenKey)
        let existed = manager.fileExists(atPath: directory)
        try SecureFile.createPrivateDirectory(directory)
        do throws(ILSError) {
            try writeFiles(
                in: directory,
                address: address,
                authority: authority,
                server: server,
                tokenKeyPEM: secrets.tokenKey
            )
            return try Files(directory: directory)
        } catch {
            discard(directory, existed: existed)
            throw error
        }
    }

    /// Opens an existing state directory, with `store` when given (PostgreSQL) or else the directory's SQLite file,
    /// and loads the identity directory from it.
    public static func load(directory: String, store givenStore: (any ControllerStore)? = nil) async throws(ILSError)
        -> ControllerState
    {
        let files = try Files(directory: directory)
        let store: any ControllerStore
        if let givenStore {
            store = givenStore
        } else {
            store = try SQLiteControllerStore(path: "\(directory)/store.sqlite")
        }
        let state = ControllerState(
            directory: directory,
            address: files.address,
            authority: files.authority,
            serverCertificatePEM: files.serverCertificatePEM,
            serverKeyPEM: files.serverKeyPEM,
            tokenKey: files.tokenKey,
            store: store
        )
        try await state.identities.reload(from: state.store)
        return state
    }

    /// The state directory's files, without the store.
    public struct Files: Sendable {
        public var address: ControllerAddress
        public var authority: CertificateAuthority
        public var serverCertificatePEM: String
        public var serverKeyPEM: String
        var tokenKey: IdentityKeyPair

        public init(directory: String) throws(ILSError) {
            func read(_ name: String) throws(ILSError) -> String {
                guard let text = try? String(contentsOfFile: "\(directory)/\(name)", encoding: .utf8) else {
                    throw ILSError(
                        .invalidInput,
                        "\(directory)/\(name) is missing or unreadable; is \(directory) a controller state directory "
                            + "(ils-gateway controller init)?"
                    )
                }
                return text
            }
            let configurationText = try read("controller.json")
            guard let configuration = try? JSONDecoder().decode(Configuration.self, from: Data(configurationText.utf8))
            else { throw ILSError(.invalidInput, "\(directory)/controller.json is not valid") }
            address = try ControllerAddress(parsing: configuration.address)
            do {
                authority = try CertificateAuthority(
                    certificatePEM: try read("ca.pem"),
                    privateKeyPEM: try read("ca.key")
                )
            } catch let error as ILSError {
                throw error
            } catch {
                throw ILSError(.invalidInput, "the CA in \(directory) could not be loaded")
            }
            guard authority.fingerprint == configuration.caFingerprint else {
                throw ILSError(.invalidInput, "\(directory)/ca.pem does not match the fingerprint in controller.json")
            }
            tokenKey = try IdentityKeyPair(privateKeyPEM: try read("token.key"))
            serverCertificatePEM = try read("server.pem")
            serverKeyPEM = try read("server.key")
        }
    }

    /// Makes the admin identity on this machine (the key never leaves it) through the same token path as every
    /// other enrollment, and writes its identity file.
    private func bootstrapAdmin(writeTo path: String, now: Date) async throws(ILSError) {
        let controller = Controller(state: self)
        let created = try await controller.createIdentity(
            ControllerAPI.CreateIdentityRequest(name: "admin", role: .admin, attributes: [], tokenLifetimeSeconds: 600),
            actor: "controller-init"
        )
        let keyPair = IdentityKeyPair.generate()
        let request = EnrollmentProof.makeRequest(token: created.token, keyPair: keyPair)
        let response = try await controller.enroll(request, now: Int64(now.timeIntervalSince1970))
        let file = IdentityFile(
            controller: address.description,
            identity: response.identity,
            certificate: response.certificate,
            caCertificate: response.caCertificate,
            privateKey: keyPair.privateKeyPEM
        )
        let directory = (path as NSString).deletingLastPathComponent
        if !directory.isEmpty { try SecureFile.createPrivateDirectory(directory) }
        try SecureFile.write(try Self.encode(file), to: path, overwrite: false)
    }

    /// A state directory is only ever made in a missing or empty directory.
    private static func refuseNonEmpty(_ directory: String) throws(ILSError) {
        if let contents = try? FileManager.default.contentsOfDirectory(atPath: directory), !contents.isEmpty {
            throw ILSError(.conflict, "\(directory) already holds a controller state (or other files); not touching it")
        }
    }

    /// The files every state directory has, a first controller's and a replica's alike (keys 0600).
    private static func writeFiles(
        in directory: String,
        address: ControllerAddress,
        authority: CertificateAuthority,
        server: (certificatePEM: String, privateKeyPEM: String),
        tokenKeyPEM: String
    ) throws(ILSError) {
        try write(authority.certificatePEM, "ca.pem", in: directory)
        try write(authority.privateKeyPEM, "ca.key", in: directory)
        try write(server.certificatePEM + "\n" + authority.certificatePEM, "server.pem", in: directory)
        try write(server.privateKeyPEM, "server.key", in: directory)
        try write(tokenKeyPEM, "token.key", in: directory)
        let configuration = Configuration(
            version: 1,
            address: address.description,
            caFingerprint: authority.fingerprint
        )
        try write(String(decoding: try encode(configuration), as: UTF8.self), "controller.json", in: directory)
    }

    /// Removes what a failed `initialize` wrote: the directory, or only its contents when it existed before.
    private static func discard(_ directory: String, existed: Bool) {
        let manager = FileManager.default
        if existed {
            for name in (try? manager.contentsOfDirectory(atPath: directory)) ?? [] {
                try? manager.removeItem(atPath: "\(directory)/\(name)")
            }
        } else {
            try? manager.removeItem(atPath: directory)
        }
    }

    private static func write(_ text: String, _ name: String, in directory: String) throws(ILSError) {
        try SecureFile.write(Data(text.utf8), to: "\(directory)/\(name)", overwrite: false)
    }

    static func encode<T: Encodable>(_ value: T) throws(ILSError) -> Data {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.prettyPrinted, .sortedKeys, .withoutEscapingSlashes]
        do {
            return try encoder.encode(value)
        } catch {
            throw ILSError(.internalError, "could not encode JSON: \(error)")
        }
    }
}
