public import ILSCore
public import ILSIdentity

/// What only each controller of a cluster knows, asked of each one directly with the same identity: the live
/// sessions are in the memory of the controller that relays them. The list of controllers is the cluster's own
/// (`GET /v1/controllers`, from the identity's controller or the first of its file's list that answers).
public enum ClusterCalls {
    /// One controller's answer, or why it gave none.
    public struct Answer<Value: Sendable>: Sendable {
        public var controller: ControllerAddress
        public var result: Result<Value, ILSError>
    }

    /// The most controllers asked: the cap identity files and enrollment answers use too.
    public static let maximumControllers = 16

    /// The cluster's controllers as `client`'s controller lists them (those with a heartbeat in the last 30 s). A
    /// controller of an earlier release has no list: then it is the only one.
    public static func controllers(_ client: ControllerClient) async throws(ILSError) -> [ControllerAddress] {
        let listed: [ControllerAPI.ControllerInfo]
        do {
            listed = try await client.call(.GET, "/v1/controllers")
        } catch {
            guard error.code == .notFound else { throw error }
            return [client.address]
        }
        // Written by the controllers themselves, but checked like any address from the network before use.
        let addresses = listed.compactMap { try? ControllerAddress(parsing: $0.address) }
        return addresses.isEmpty ? [client.address] : Array(addresses.prefix(maximumControllers))
    }

    /// `GET path` on every one of `controllers` at once, each with its own bounded connection; answers in the
    /// order of `controllers`.
    public static func ask<Value: Decodable & Sendable>(
        _ client: ControllerClient,
        _ path: String,
        at controllers: [ControllerAddress],
        as type: Value.Type = Value.self
    ) async -> [Answer<Value>] {
        await withTaskGroup(of: (Int, Answer<Value>).self) { group in
            for (index, address) in controllers.enumerated() {
                group.addTask {
                    do throws(ILSError) {
                        let value: Value = try await client.only(address).call(.GET, path)
                        return (index, Answer(controller: address, result: .success(value)))
                    } catch {
                        return (index, Answer(controller: address, result: .failure(error)))
                    }
                }
            }
            var answers: [(Int, Answer<Value>)] = []
            for await answer in group { answers.append(answer) }
            return answers.sorted { $0.0 < $1.0 }.map(\.1)
        }
    }
}
