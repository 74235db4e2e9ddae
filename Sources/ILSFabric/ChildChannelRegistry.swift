import NIOConcurrencyHelpers
public import NIOCore

/// The accepted connections of a server, so a drain that runs past its deadline can close what is left.
public final class ChildChannelRegistry: Sendable {
    private let channels = NIOLockedValueBox<[ObjectIdentifier: any Channel]>([:])

    public init() {}

    public func add(_ channel: any Channel) {
        let key = ObjectIdentifier(channel)
        channels.withLockedValue { $0[key] = channel }
        channel.closeFuture.whenComplete { _ in
            _ = self.channels.withLockedValue { $0.removeValue(forKey: key) }
        }
    }

    public var count: Int { channels.withLockedValue { $0.count } }

    public func closeAll() {
        let open = channels.withLockedValue { Array($0.values) }
        for channel in open { channel.close(promise: nil) }
    }
}
