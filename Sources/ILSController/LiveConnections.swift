import Foundation
import ILSCore
import ILSFabric
import NIOConcurrencyHelpers
import NIOCore
import NIOHTTP2

/// The controller's live overlay connections, by identity, and the gateways' control streams: what a revocation
/// must reach before the admin's command returns.
final class LiveConnections: Sendable {
    private let connections = NIOLockedValueBox<[String: [ObjectIdentifier: any Channel]]>([:])
    private let controlStreams = NIOLockedValueBox<[ObjectIdentifier: ControlStream]>([:])
    private let grantOrder = NIOLock()
    /// The dial grant last pushed for each service.
    private let sentGrants = NIOLockedValueBox<[String: Set<String>]>([:])
    /// Pushes being written to control streams, by a running number: what `delivered` waits for.
    private let inFlight = NIOLockedValueBox<(next: Int, writes: [Int: EventLoopFuture<Void>])>((0, [:]))

    /// How long `delivered` waits for a gateway's connection to take a push: a gateway that stopped reading must not
    /// hold an admin's answer (what it was sent is still written if it reads again, and the relay here enforces the
    /// change on its own circuits regardless).
    static let deliveryBound: TimeAmount = .seconds(2)

    func add(_ channel: any Channel, identityID: String) {
        let key = ObjectIdentifier(channel)
        connections.withLockedValue { $0[identityID, default: [:]][key] = channel }
        channel.closeFuture.whenComplete { _ in
            self.connections.withLockedValue { connections in
                connections[identityID]?[key] = nil
                if connections[identityID]?.isEmpty == true { connections[identityID] = nil }
            }
        }
    }

    /// A gateway's control stream: its service and identity, for pushes of that service's grant and for closing the
    /// links a narrowed bind policy no longer allows.
    struct ControlStream {
        let channel: any Channel
        let service: String
        let gatewayID: String
    }

    func addControlStream(_ channel: any Channel, service: String, gatewayID: String) {
        let key = ObjectIdentifier(channel)
        controlStreams.withLockedValue {
            $0[key] = ControlStream(channel: channel, service: service, gatewayID: gatewayID)
        }
        channel.closeFuture.whenComplete { _ in
            _ = self.controlStreams.withLockedValue { $0.removeValue(forKey: key) }
        }
    }

    /// Closes the gateway links of `service` (hosting and policy-only) whose gateway `keep` says no to: the gateway
    /// links again and is refused, or finds the service gone, and backs off.
    func closeLinks(service: String, keep: (_ gatewayID: String) -> Bool) -> Int {
        let doomed = controlStreams.withLockedValue { streams in
            streams.values.filter { $0.service == service && !keep($0.gatewayID) }
        }
        for stream in doomed { (stream.channel.parent ?? stream.channel).close(promise: nil) }
        return doomed.count
    }

    /// Closes every connection of the identity, and with them all its circuits (each relay half closes its partner).
    func close(identityID: String) {
        let open = connections.withLockedValue { Array(($0[identityID] ?? [:]).values) }
        for channel in open { channel.close(promise: nil) }
    }

    /// Closes every connection of an identity that may no longer connect (revoked, disabled, deleted), each first
    /// told why (`BlockedNotice`), so a device ends its circuits with `identity_blocked` instead of trying to resume
    /// them. Each closes once its notice is written, or `noticeBound` after at most (a device that stopped reading does
    /// not keep its connection open by that), and this returns then.
    ///
    /// Tell the gateways of the block only after this returns. A gateway ends the identity's circuits itself with a
    /// CANCEL, which the relay passes on to the device; told at once, its CANCEL came back on a loop that was busy
    /// (an event loop serves the I/O it finds ready before the tasks queued meanwhile, the notice's write among them)
    /// and reached the device before the notice: it reported `truncated` and tried to resume (a busy hunt, session 40).
    func close(identityID: String, blocked reason: String) async {
        let open = connections.withLockedValue { Array(($0[identityID] ?? [:]).values) }
        let closed = open.map { channel in
            let done = channel.eventLoop.makePromise(of: Void.self)
            let once = NIOLockedValueBox(false)
            let close: @Sendable () -> Void = {
                let first = once.withLockedValue { closed -> Bool in
                    defer { closed = true }
                    return !closed
                }
                guard first else { return }
                channel.close(promise: nil)
                done.succeed()
            }
            let backstop = channel.eventLoop.scheduleTask(in: Self.noticeBound) { close() }
            channel.writeAndFlush(BlockedNotice.frame(reason: reason)).whenComplete { _ in
                backstop.cancel()
                close()
            }
            return done.futureResult
        }
        for future in closed { try? await future.get() }
    }

    /// How long a connection being closed for a blocked identity waits for its notice to be written.
    static let noticeBound: TimeAmount = .milliseconds(500)

    /// Computes a grant and sends it on its service's control streams, under one lock, so two grants of a service
    /// computed one after the other from different threads reach every stream in that order (writes from one thread
    /// to a channel keep their order). Returns what `compute` returned.
    /// `beforePush` runs under the same lock, after `compute` and before the gateways are sent the grant.
    func publishGrant<T>(
        compute: () -> (T, DialGrant)?,
        beforePush: (T, DialGrant) -> Void = { _, _ in }
    ) -> (T, DialGrant)? {
        grantOrder.withLock {
            guard let (value, grant) = compute() else { return nil }
            beforePush(value, grant)
            push(HostControlMessage(dialGrant: grant), service: grant.service)
            return (value, grant)
        }
    }

    /// Whether the grant last sent for `service` holds `identityID` (false before any was sent).
    func isGranted(_ identityID: String, service: String) -> Bool {
        sentGrants.withLockedValue { $0[service]?.contains(identityID) ?? false }
    }

    /// Sends `message` on every gateway's control stream (or only those of `service`), as one JSON line.
    func push(_ message: HostControlMessage, service: String? = nil) {
        if let grant = message.dialGrant {
            sentGrants.withLockedValue { $0[grant.service] = Set(grant.identities) }
        }
        guard var line = try? JSONEncoder().encode(message) else { return }
        line.append(UInt8(ascii: "\n"))
        let streams = controlStreams.withLockedValue { streams in
            streams.values.filter { service == nil || $0.service == service }.map(\.channel)
        }
        for stream in streams {
            let payload = HTTP2Frame.FramePayload.data(.init(data: .byteBuffer(ByteBuffer(bytes: line))))
            let written = stream.writeAndFlush(payload)
            let number = inFlight.withLockedValue { inFlight -> Int in
                defer { inFlight.next += 1 }
                inFlight.writes[inFlight.next] = written
                return inFlight.next
            }
            written.whenComplete { _ in _ = self.inFlight.withLockedValue { $0.writes.removeValue(forKey: number) } }
        }
    }

    /// Returns once every push made before the call has been written to its gateway's connection (or failed with a
    /// connection that closed), or after `deliveryBound`.
    func delivered() async {
        let writes = inFlight.withLockedValue { Array($0.writes.values) }
        guard let loop = writes.first?.eventLoop else { return }
        let done = loop.makePromise(of: Void.self)
        let timeout = loop.scheduleTask(in: Self.deliveryBound) {
            ControllerMetrics.pushesUndelivered.increment()
            done.succeed()
        }
        EventLoopFuture.whenAllComplete(writes, on: loop).whenComplete { _ in
            timeout.cancel()
            done.succeed()
        }
        try? await done.futureResult.get()
    }

    var connectedIdentities: Int { connections.withLockedValue { $0.count } }
}
