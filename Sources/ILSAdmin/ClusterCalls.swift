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
            listed = try await client.call(ControllerRoutes.controllers)
        } catch {
            guard error.code == .notFound else { throw error }
            return [client.address]
        }
        // Written by the controllers themselves, but checked like any address from the network before use.
        let addresses = listed.compactMap { try? ControllerAddress(parsing: $0.address) }
        return addresses.isEmpty ? [client.address] : Array(addresses.prefix(maximumControllers))
    }

    /// `route` on every one of `controllers` at once, each with its own bounded connection; answers in the order of
    /// `controllers`.
    public static func ask<Value: Decodable & Sendable>(
        _ client: ControllerClient,
        _ route: ControllerRoute<NoBody, Value>,
        name: String? = nil,
        at controllers: [ControllerAddress]
    ) async -> [Answer<Value>] {
        await withTaskGroup(of: (Int, Answer<Value>).self) { group in
            for (index, address) in controllers.enumerated() {
                group.addTask {
                    do throws(ILSError) {
                        let value = try await client.only(address).call(route, name: name)
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

    /// Every controller's answer to `route`, split into those that answered and those that did not.
    public struct Gathered<Value: Sendable>: Sendable {
        public var answered: [(controller: ControllerAddress, value: Value)] = []
        public var failed: [(controller: ControllerAddress, error: ILSError)] = []
    }

    /// `ask` of every controller of the cluster. When none answers it throws the first refusal, so an empty list
    /// never stands for "nothing there" when it means "nobody answered"; a partial answer is the caller's to name
    /// (`admin sessions` on stderr, the console on the page).
    public static func gather<Value: Decodable & Sendable>(
        _ client: ControllerClient,
        _ route: ControllerRoute<NoBody, Value>,
        name: String? = nil
    ) async throws(ILSError) -> Gathered<Value> {
        var gathered = Gathered<Value>()
        for answer in await ask(client, route, name: name, at: try await controllers(client)) {
            switch answer.result {
            case .success(let value): gathered.answered.append((answer.controller, value))
            case .failure(let error): gathered.failed.append((answer.controller, error))
            }
        }
        if gathered.answered.isEmpty, let first = gathered.failed.first { throw first.error }
        return gathered
    }

    /// One entry per service across the controllers' lists: the policies of the highest revision any controller
    /// reported (a replica may not have heard of the latest change yet), with every controller's hosts.
    public static func mergeServices(_ lists: [[ControllerAPI.ServiceInfo]]) -> [ControllerAPI.ServiceInfo] {
        var byName: [String: ControllerAPI.ServiceInfo] = [:]
        for service in lists.joined() {
            guard var merged = byName[service.name] else {
                byName[service.name] = service
                continue
            }
            let hosts = merged.hosts + service.hosts
            if service.revision > merged.revision { merged = service }
            merged.hosts = hosts
            byName[service.name] = merged
        }
        return byName.values.sorted { $0.name < $1.name }
    }
}
