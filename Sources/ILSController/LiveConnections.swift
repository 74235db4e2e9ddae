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
    private let controlStreams = NIOLockedValueBox<[ObjectIdentifier: any Channel]>([:])

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

    func addControlStream(_ channel: any Channel) {
        let key = ObjectIdentifier(channel)
        controlStreams.withLockedValue { $0[key] = channel }
        channel.closeFuture.whenComplete { _ in
            _ = self.controlStreams.withLockedValue { $0.removeValue(forKey: key) }
        }
    }

    /// Closes every connection of the identity, and with them all its circuits (each relay half closes its partner).
    func close(identityID: String) {
        let open = connections.withLockedValue { Array(($0[identityID] ?? [:]).values) }
        for channel in open { channel.close(promise: nil) }
    }

    /// Sends `message` on every gateway's control stream, as one JSON line.
    func push(_ message: HostControlMessage) {
        guard var line = try? JSONEncoder().encode(message) else { return }
        line.append(UInt8(ascii: "\n"))
        let streams = controlStreams.withLockedValue { Array($0.values) }
        for stream in streams {
            let payload = HTTP2Frame.FramePayload.data(.init(data: .byteBuffer(ByteBuffer(bytes: line))))
            stream.writeAndFlush(payload, promise: nil)
        }
    }

    var connectedIdentities: Int { connections.withLockedValue { $0.count } }
}
