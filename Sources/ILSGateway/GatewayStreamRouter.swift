import Foundation
public import ILSCore
public import ILSCrypto
public import ILSFabric
import ILSProxy
import ILSSodium
import Logging
import NIOConcurrencyHelpers
package import NIOCore
import NIOHPACK
import NIOHTTP1
import NIOHTTP2

/// What the gateway currently knows from the controller: who may dial the service it hosts, and who is revoked.
public final class GatewayPolicy: Sendable {
    private let dialRoles = NIOLockedValueBox<[IdentityRole]?>(nil)
    private let revoked = NIOLockedValueBox(Blocks())
    /// Who may dial, by identity id, as each controller replica linked now last sent it (`DialGrant`); an identity is
    /// admitted only if every one of them holds it (`Grants`). Without any (controllers of an earlier release),
    /// `dialRoles` decides.
    private let grants = NIOLockedValueBox(Grants())
    /// Live circuits by the verified identity id at their far end.
    private let circuits = NIOLockedValueBox<[String: [ObjectIdentifier: any Channel]]>([:])

    public init() {}

    public func update(_ roles: [IdentityRole]) { dialRoles.withLockedValue { $0 = roles } }

    /// The block lists, one per controller replica that sent one, and their union, which is what is enforced.
    ///
    /// Per replica, not the last list received: replicas share a store, but a block the store could not save is in
    /// force only on the controller that made it (`UnsavedBlocks`), so another replica's list, sent later, would
    /// otherwise lift it here. A block from any controller blocks.
    private struct Blocks {
        var byController: [String: Set<String>] = [:]
        var union: Set<String> = []

        mutating func set(_ ids: Set<String>?, from controller: String) {
            byController[controller] = ids
            union = byController.values.reduce(into: []) { $0.formUnion($1) }
        }

        func contains(_ id: String) -> Bool { union.contains(id) }
    }

    /// The dial grants, one per controller replica linked now, and the rule that decides with them: **every** grant
    /// must hold the identity (their intersection).
    ///
    /// Replicas share one store, but each computes its grant from its own copy of the directory, kept current by the
    /// store's change feed. A replica whose feed is stalled keeps sending the grant from before a narrowing made
    /// through another replica; if each circuit were judged by the grant of the replica that relayed it, a device
    /// pinned to the stalled replica would keep getting in (review 3 measured 1,756 requests, up to 22 s after the
    /// admin's command returned). The replica that made the change pushes its narrowed grant to this gateway before it
    /// answers, so with the intersection the narrowing is in force here at once, whichever replica relays the circuit
    /// and however stale the others are. A stale replica can only keep someone *out* a while longer: a widening is in
    /// force once every linked replica has heard it (at once normally; after a stalled feed, once its probe replaces
    /// the listening connection, 25 s at most; docs/design/cluster.md "A narrowing fails closed").
    ///
    /// A replica's grant stays while its links are down (it may be the only replica that knows of a narrowing) and
    /// goes when it leaves the controller list (`forgetRevoked`). What it took away while unlinked is taken away when
    /// it links again, since every update ends the circuits the intersection no longer holds, not only those the
    /// updating replica dropped.
    private struct Grants {
        var byController: [String: Set<String>] = [:]

        /// Whether the grants allow `id`; `nil` when no linked controller sent one (the roles decide).
        func allows(_ id: String) -> Bool? {
            byController.isEmpty ? nil : byController.values.allSatisfy { $0.contains(id) }
        }
    }

    /// Replaces the list of blocked (revoked or disabled) identities that `controller` sent, and closes the live
    /// circuits of every identity now blocked at once. `controller` names the replica (HTTP mode's single policy
    /// link leaves it empty).
    public func updateRevoked(_ ids: [String], from controller: String = "") {
        let blocked = revoked.withLockedValue { revoked -> Set<String> in
            revoked.set(Set(ids), from: controller)
            return revoked.union
        }
        let doomed = circuits.withLockedValue { circuits in
            blocked.flatMap { circuits[$0].map { Array($0.values) } ?? [] }
        }
        for channel in doomed { CircuitCloseHandler.abort(channel) }
    }

    /// Replaces the grant `controller` sent for the hosted service and ends, at once, the live circuits of every
    /// identity the grants no longer hold all together (`Grants`). A grant for another service, with more than
    /// `DialGrant.maximumIdentities` ids, or with an id that could not be one, is dropped whole: what is in force stays.
    /// Returns whether it was applied.
    @discardableResult
    public func updateGrant(_ grant: DialGrant, from controller: String = "", hosted: String) -> Bool {
        guard grant.service == hosted, grant.identities.count <= DialGrant.maximumIdentities,
            grant.identities.allSatisfy(Self.couldBeID)
        else { return false }
        let allowed = Set(grant.identities)
        let grants = grants.withLockedValue { grants in
            grants.byController[controller] = allowed
            return grants
        }
        let doomed = circuits.withLockedValue { circuits in
            circuits.filter { grants.allows($0.key) == false }.flatMap { Array($0.value.values) }
        }
        for channel in doomed { CircuitCloseHandler.abort(channel) }
        return true
    }

    /// Adds `identityID` to the grant in force from `controller`: that controller answered, for a connection's
    /// certificate, that the service's dial policy allows the identity now, and its grant saying so is on its way (a
    /// device that dials straight after it was created can get there first). The next grant replaces the set whole,
    /// so a narrowing still takes the identity away. Without a grant from `controller` (roles decide) nothing changes.
    package func admitFromVerdict(_ identityID: String, from controller: String = "") {
        guard Self.couldBeID(identityID) else { return }
        grants.withLockedValue { grants in
            guard grants.byController[controller] != nil else { return }
            grants.byController[controller]?.insert(identityID)
        }
    }

    /// Whether the grant of every linked controller other than `controller` holds `id` (true when there is none):
    /// HTTP mode admits on its own controller's fresh answer only if the others do not say otherwise.
    package func grantedByOthers(_ id: String, besides controller: String) -> Bool {
        grants.withLockedValue { grants in
            grants.byController.allSatisfy { $0.key == controller || $0.value.contains(id) }
        }
    }

    /// Identity ids are lowercase UUIDs; anything outside the identity-name rules (1-64 of `A-Za-z0-9._-`) is not
    /// one, and is never stored or logged.
    static func couldBeID(_ id: String) -> Bool {
        (try? IdentityName.validate(id)) != nil
    }

    /// Forgets `controller`'s block list: the replica left the controller list and the gateway no longer links to
    /// it (what it blocked is in the store, and so in the other replicas' lists, unless it died unsaved with it).
    func forgetRevoked(from controller: String) {
        revoked.withLockedValue { $0.set(nil, from: controller) }
        forgetGrant(from: controller)
    }

    /// Drops `controller`'s grant (it left the controller list). The block list it sent is `forgetRevoked`'s to drop.
    package func forgetGrant(from controller: String) {
        _ = grants.withLockedValue { $0.byController.removeValue(forKey: controller) }
    }

    /// Remembers an established circuit so a revocation or a narrowed grant can end it.
    package func track(_ channel: any Channel, identityID: String) {
        let key = ObjectIdentifier(channel)
        circuits.withLockedValue { $0[identityID, default: [:]][key] = channel }
        GatewayMetrics.circuitsTotal.increment()
        GatewayMetrics.circuitsActive.increment()
        channel.closeFuture.whenComplete { _ in
            GatewayMetrics.circuitsActive.decrement()
            self.circuits.withLockedValue { circuits in
                circuits[identityID]?[key] = nil
                if circuits[identityID]?.isEmpty == true { circuits[identityID] = nil }
            }
        }
        // Revoked, or its grant taken away, between the handshake and now: close at once.
        let granted = grants.withLockedValue { $0.allows(identityID) } ?? true
        if revoked.withLockedValue({ $0.contains(identityID) }) || !granted { CircuitCloseHandler.abort(channel) }
    }

    /// Whether the gateway itself would refuse this identity.
    public func blocks(_ identityID: String) -> Bool { revoked.withLockedValue { $0.contains(identityID) } }

    /// Whether a circuit of `identityID` may go on (a resumption): not blocked, and every grant holds it.
    package func stillAdmits(_ identityID: String) -> Bool {
        !blocks(identityID) && (grants.withLockedValue { $0.allows(identityID) } ?? true)
    }

    /// How many circuits are live (for tests and metrics).
    public var liveCircuits: Int { circuits.withLockedValue { $0.values.reduce(0) { $0 + $1.count } } }

    var isKnown: Bool { dialRoles.withLockedValue { $0 != nil } }

    /// Forgets the dial policy when the controller connection is lost: it is sent again on the next one. The block
    /// list is kept meanwhile, so a revoked device stays out.
    func connectionLost() { dialRoles.withLockedValue { $0 = nil } }

    /// The gateway's own decision, made after it verified the device's certificate itself. Until the controller
    /// has sent the policy, nobody gets in.
    public func decide(_ peer: IdentityCertificate, service: String, hosted: String) -> AccessDecision {
        guard service == hosted else { return .deny(reason: "this gateway hosts '\(hosted)', not '\(service)'") }
        // Checked before anything else about the identity: a revoked device stays out even if a relay
        // misbehaves and lets its circuit through.
        guard !revoked.withLockedValue({ $0.contains(peer.id) }) else {
            return .deny(reason: "identity '\(peer.name)' is revoked")
        }
        guard let roles = dialRoles.withLockedValue({ $0 }) else {
            return .deny(reason: "the gateway has not received its policy yet; retry shortly")
        }
        let allowed = grants.withLockedValue { $0.allows(peer.id) } ?? roles.contains(peer.role)
        guard allowed else {
            return .deny(reason: "identity '\(peer.name)' (role \(peer.role.rawValue)) may not dial '\(service)'")
        }
        return .allow
    }
}

/// Whether the controller's binding answer has been applied on one connection, and the circuits that wait for it.
///
/// The controller writes the answer before any circuit's head on the connection, but swift-nio-http2 hands a new
/// stream its first frame as the stream is created, while a frame for an existing stream (the control stream) waits
/// for the end of the read: from one read holding both, the circuit would be seen first. A circuit that arrived
/// first waits here until the answer is applied, so a link the answer tells the gateway to drop (a second link on
/// one controller loop) is dropped before it accepts any circuit; the relay then opens those circuits elsewhere.
final class LinkBinding: Sendable {
    private struct State {
        var isBound = false
        var waiting: [() -> Void] = []
    }

    private let state: NIOLoopBoundBox<State>

    init(eventLoop: any EventLoop) {
        state = NIOLoopBoundBox(State(), eventLoop: eventLoop)
    }

    /// Runs `body` once the binding is applied: now if it is.
    func whenBound(_ body: @escaping () -> Void) {
        if state.value.isBound {
            body()
        } else {
            state.value.waiting.append(body)
        }
    }

    /// The binding is applied; the waiting circuits go on if `connection` is still open (otherwise they close with it).
    func bound(connection: (any Channel)?) {
        guard !state.value.isBound else { return }
        state.value.isBound = true
        let waiting = state.value.waiting
        state.value.waiting = []
        guard connection?.isActive ?? false else { return }
        for body in waiting { body() }
    }
}

/// The first handler of every stream the controller opens to the gateway. The control stream (`GET
/// /ils/v1/host`) is answered with the hosted service and then carries the policy; a `CONNECT` becomes a circuit:
/// end-to-end handshake first, then the proxy core.
final class GatewayStreamRouter: ChannelInboundHandler, RemovableChannelHandler {
    typealias InboundIn = HTTP2Frame.FramePayload
    typealias OutboundOut = HTTP2Frame.FramePayload

    struct Context: Sendable {
        /// The controller replica this connection links to, whose block list its pushes replace.
        var controller = ""
        let service: String
        let credentials: E2EHandshake.Credentials
        let policy: GatewayPolicy
        let core: ProxyCore
        let logger: Logger
        /// Called with the controller's refusal to let this gateway host the service: the connection, the reason, and
        /// its `HostControlMessage.errorCode`.
        let onRefusal: @Sendable (_ connection: (any Channel)?, _ reason: String, _ code: String?) -> Void
        /// Called with the connection and the controller event loop it landed on, of how many (`nil` from a
        /// controller that does not say), when the controller accepts the binding.
        var onBound: @Sendable (_ connection: any Channel, _ relayLoop: Int?, _ relayLoops: Int?) -> Void = { _, _, _ in
        }
        /// Called with the controller list the controller sent (in its binding answer and when the list changes).
        var onControllers: @Sendable (_ controllers: [String]) -> Void = { _ in }
        /// How long a device may take to complete the end-to-end handshake.
        var handshakeTimeout = E2EResponderHandler.handshakeTimeout
        /// The connection's binding: circuits wait for it (nil: they do not wait).
        var binding: LinkBinding?
        /// The gateway's resumable circuits (shared by all its links: a circuit resumes on whichever link the relay
        /// picks) and what each may hold for resumption.
        var circuits = ResumableCircuits()
        var retention = CircuitRetention.standard
    }

    /// A connection's `Context`, shared by reference by every stream's router and every circuit's handshake
    /// closures. Captured by value, as before, the context (its credentials hold the CA's certificate) was copied
    /// into both closures of every circuit: 0.9 KiB each, 1.8 KiB of the gateway's memory per open circuit.
    final class Shared: Sendable {
        let context: Context

        init(_ context: Context) {
            self.context = context
        }
    }

    private let shared: Shared
    private var settings: Context { shared.context }
    private var isControl = false
    private var controlBuffer = ByteBuffer()
    /// A circuit's frames while it waits for the connection's binding, in order.
    private var held: [NIOAny]?

    init(_ shared: Shared) {
        self.shared = shared
    }

    convenience init(_ settings: Context) {
        self.init(Shared(settings))
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        let payload = unwrapInboundIn(data)
        if isControl {
            readControl(payload, context: context)
            return
        }
        if held != nil {
            held?.append(data)
            return
        }
        guard case .headers(let request) = payload else {
            context.close(promise: nil)
            return
        }
        if request.headers.first(name: ":path") == FabricProtocol.controlPath {
            isControl = true
            let headers = HPACKHeaders([(":status", "200"), (FabricProtocol.serviceHeader, settings.service)])
            context.writeAndFlush(wrapOutboundOut(.headers(.init(headers: headers))), promise: nil)
            return
        }
        guard let binding = settings.binding else {
            startCircuit(context: context, head: data)
            return
        }
        held = []
        binding.whenBound { [self] in
            let frames = held ?? []
            held = nil
            guard context.channel.isActive else { return }
            startCircuit(context: context, head: data, then: frames)
        }
    }

    /// Hands the stream to a `CircuitAcceptor` (and the end-to-end handshake after it), with its first frames.
    private func startCircuit(context: ChannelHandlerContext, head: NIOAny, then frames: [NIOAny] = []) {
        let shared = self.shared
        let acceptor = CircuitAcceptor { service, headers, stream in
            guard service == shared.context.service else {
                return stream.eventLoop.makeSucceededFuture(
                    .refuse(
                        status: 404,
                        code: "unknown_service",
                        reason: "this gateway hosts '\(shared.context.service)'"
                    )
                )
            }
            return stream.eventLoop.makeSucceededFuture(
                .accept(install: { pipeline in
                    try pipeline.addHandler(StreamDataCodec())
                    try pipeline.addHandler(ByteToMessageHandler(FrameDecoder()))
                    if headers.first(name: FabricProtocol.resumeHeader) != nil {
                        try shared.context.circuits.acceptResumption(
                            on: pipeline,
                            deviceID: headers.first(name: FabricProtocol.deviceIDHeader),
                            timeout: shared.context.handshakeTimeout
                        ) { identityID in
                            guard shared.context.policy.stillAdmits(identityID) else {
                                GatewayMetrics.refusal("resume")
                                return "the identity may no longer use this circuit"
                            }
                            return nil
                        }
                        return
                    }
                    let path = CircuitPathHandler()
                    try pipeline.addHandler(path)
                    let circuit = CircuitChannel(
                        eventLoop: stream.eventLoop,
                        allocator: stream.allocator,
                        retention: shared.context.retention
                    )
                    circuit.register(in: shared.context.circuits)
                    circuit.start(on: path)
                    try circuit.pipeline.syncOperations.addHandler(
                        E2EResponderHandler(
                            credentials: shared.context.credentials,
                            versions: E2EHandshakeVersions.all,
                            // With a grace window of 0 this gateway holds nothing: it agrees suite 4 at most, so no
                            // record is kept or acknowledged at either end (docs/operations.md, "Resumption").
                            suites: shared.context.retention.grace > .zero
                                ? Set(E2ESuite.allCases) : Set(E2ESuite.allCases.filter { !$0.isResumable }),
                            authorize: { peer, requested in
                                let decision = shared.context.policy.decide(
                                    peer,
                                    service: requested,
                                    hosted: shared.context.service
                                )
                                if case .deny(let reason) = decision {
                                    GatewayMetrics.refusal(reason.contains("revoked") ? "revoked" : "policy")
                                    shared.context.logger.notice("circuit refused", metadata: ["reason": "\(reason)"])
                                }
                                return decision
                            },
                            onEstablished: { channel, event in
                                shared.context.policy.track(channel, identityID: event.peer.id)
                                let pipeline = channel.pipeline.syncOperations
                                try shared.context.core.configureClientPipeline(
                                    pipeline,
                                    client: ClientContext(remoteAddress: nil, scheme: .https, identity: event.peer)
                                )
                                // Between the HTTP codec and the proxy core: a close between two exchanges is a
                                // clean end of the circuit (FINAL), one mid-response a cut.
                                try pipeline.addHandler(
                                    CircuitCloseHandler(),
                                    position: .after(try pipeline.handler(type: HTTPServerPipelineHandler.self))
                                )
                            },
                            handshakeTimeout: shared.context.handshakeTimeout,
                            // While the circuit carries HTTP exchanges (`CircuitCloseHandler` leaves at a 101), the
                            // device's END_STREAM without FINAL ends its input and HTTP's framing decides: a whole
                            // request is answered in full, one cut mid-body is refused and its backend request aborted.
                            unsealedEnd: { channel in
                                (try? channel.pipeline.syncOperations.handler(type: CircuitCloseHandler.self)) != nil
                                    ? .endOfInput : .cut
                            },
                            onCancelled: { GatewayMetrics.circuitsCancelled.increment() }
                        )
                    )
                })
            )
        }
        do {
            try context.pipeline.syncOperations.addHandler(acceptor, position: .after(self))
        } catch {
            context.close(promise: nil)
            return
        }
        context.fireChannelRead(head)
        for frame in frames { context.fireChannelRead(frame) }
        if !frames.isEmpty { context.fireChannelReadComplete() }
        context.pipeline.syncOperations.removeHandler(self, promise: nil)
    }

    private func readControl(_ payload: HTTP2Frame.FramePayload, context: ChannelHandlerContext) {
        guard case .data(let frame) = payload, case .byteBuffer(var buffer) = frame.data else { return }
        // Messages are JSON lines; a long one may span several DATA frames.
        controlBuffer.writeBuffer(&buffer)
        guard controlBuffer.readableBytes <= 4 * 1024 * 1024 else {
            context.channel.parent?.close(promise: nil)
            return
        }
        while let newline = controlBuffer.readableBytesView.firstIndex(of: UInt8(ascii: "\n")) {
            let line = controlBuffer.readSlice(length: newline - controlBuffer.readerIndex)!
            controlBuffer.moveReaderIndex(forwardBy: 1)
            guard let message = try? JSONDecoder().decode(HostControlMessage.self, from: Data(line.readableBytesView))
            else { continue }
            apply(message, connection: context.channel.parent)
        }
        controlBuffer.discardReadBytes()
    }

    private func apply(_ message: HostControlMessage, connection: (any Channel)?) {
        if let blocked = message.blocked {
            settings.policy.updateRevoked(blocked, from: settings.controller)
        }
        if let controllers = message.controllers {
            settings.onControllers(controllers)
        }
        if let grant = message.dialGrant {
            // Before the roles: a binding answer carries both, and the grant decides once it is here.
            let applied = settings.policy.updateGrant(grant, from: settings.controller, hosted: settings.service)
            if !applied {
                settings.logger.warning(
                    "the controller sent a dial grant this gateway cannot apply; the previous one stays in force",
                    metadata: ["service": "\(ControlCharacters.bounded(grant.service, limit: 64))"]
                )
            }
        }
        if let roles = message.dialRoles {
            settings.policy.update(roles)
            if let connection { settings.onBound(connection, message.relayLoop, message.relayLoops) }
            // After `onBound`, which closes a link it does not keep: its waiting circuits then close unanswered.
            settings.binding?.bound(connection: connection)
        } else if let error = message.error {
            settings.onRefusal(connection, error, message.errorCode)
        }
    }
}
