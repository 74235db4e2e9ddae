import Foundation
import ILSClient
import ILSController
import ILSCore
import ILSTesting
import Logging
import NIOPosix

/// A controller on 127.0.0.1 with a fresh state directory, and the admin identity `init` wrote.
struct ControllerFixture {
    let directory: String
    let state: ControllerState
    let server: ControllerServer
    let adminPath: String

    /// The admin API, waiting on answers as on events (`patient`).
    var admin: ControllerClient {
        get throws { try ControllerClient(identityFile: try IdentityFileIO.read(adminPath)).patient }
    }
    var controller: Controller { Controller(state: state) }

    static func with<T>(_ body: (ControllerFixture) async throws -> T) async throws -> T {
        let fixture = try await startFresh()
        defer { try? FileManager.default.removeItem(atPath: fixture.directory) }
        do {
            let result = try await body(fixture)
            await fixture.server.shutdown()
            return result
        } catch {
            await fixture.server.shutdown()
            throw error
        }
    }

    /// A controller with a fresh state directory on a free port. The port is picked before the state is made (the
    /// controller's certificate names it), so another process may take it before the bind: then it tries again on
    /// another port, as `TestCluster` does.
    private static func startFresh(attempts: Int = 5) async throws -> ControllerFixture {
        for attempt in 1...attempts {
            let directory = FileManager.default.temporaryDirectory.appendingPathComponent(
                "ils-ctl-\(UUID().uuidString)"
            ).path
            let port = try freePort()
            do {
                let state = try await ControllerState.initialize(
                    directory: "\(directory)/state",
                    address: try ControllerAddress(parsing: "https://127.0.0.1:\(port)"),
                    adminOut: "\(directory)/identities/admin.json"
                )
                return try await start(directory: directory, state: state, port: port)
            } catch {
                try? FileManager.default.removeItem(atPath: directory)
                guard attempt < attempts, "\(error)".contains("Address already in use") else { throw error }
            }
        }
        preconditionFailure("the last attempt returns or throws")
    }

    static func start(directory: String, state: ControllerState, port: Int) async throws -> ControllerFixture {
        let server = try ControllerServer(
            state: state,
            listen: HostPort(host: "127.0.0.1", port: port),
            logger: Logger(label: "test", factory: { _ in SwiftLogNoOpLogHandler() })
        )
        _ = try await server.start()
        return ControllerFixture(
            directory: directory,
            state: state,
            server: server,
            adminPath: "\(directory)/identities/admin.json"
        )
    }

    /// Creates an identity through the admin API and returns its token.
    func token(for name: String, role: IdentityRole = .device, lifetime: Int64 = 3600) async throws -> String {
        let response: ControllerAPI.TokenResponse = try await admin.call(
            .POST,
            "/v1/admin/identities",
            body: ControllerAPI.CreateIdentityRequest(
                name: name,
                role: role,
                attributes: [],
                tokenLifetimeSeconds: lifetime
            )
        )
        return response.token
    }

    func path(_ name: String) -> String { "\(directory)/out/\(name)" }
}

func freePort() throws -> Int {
    let channel = try ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton)
        .bind(host: "127.0.0.1", port: 0).wait()
    let port = channel.localAddress!.port!
    try channel.close().wait()
    return port
}

func fileMode(_ path: String) -> Int? {
    (try? FileManager.default.attributesOfItem(atPath: path)[.posixPermissions] as? Int) ?? nil
}
