import Foundation
import ILSCore
import ILSCrypto
import ILSFabric
import ILSTesting
import NIOConcurrencyHelpers
import NIOPosix
import Testing

@testable import ILSClient

#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// Issue 39, the app's identity stays valid: renewed through the app's own `IdentityStore` when it is due, and an
/// expired one refused with its own reason. The dialer's clock is moved instead of waiting 60 days; the controller,
/// its CA and the renewal over mTLS are real.
@Suite("The app renews its identity through its own store", .clusterExclusive)
struct IdentityRenewalTests {
    /// An app's store (a Keychain, say) in memory: what was saved, in order.
    final class MemoryStore: IdentityStore, @unchecked Sendable {
        private let lock = NIOLock()
        private var stored: IdentityFile?
        private(set) var saves: [IdentityFile] = []

        init(_ identity: IdentityFile) { stored = identity }

        func load() throws(ILSError) -> IdentityFile? { lock.withLock { stored } }
        func save(_ identity: IdentityFile) throws(ILSError) {
            lock.withLock {
                stored = identity
                saves.append(identity)
            }
        }
        func delete() throws(ILSError) { lock.withLock { stored = nil } }
        var saved: [IdentityFile] { lock.withLock { saves } }
    }

    static let day: TimeInterval = 86400

    /// A dialer for `identity` whose clock reads `offset()` seconds ahead of the real one.
    static func dialer(_ identity: IdentityFile, offset: NIOLockedValueBox<TimeInterval>) throws -> OverlayDialer {
        try OverlayDialer(
            identity: identity,
            eventLoop: MultiThreadedEventLoopGroup.singleton.next(),
            keepalive: .standard,
            handshakeVersion: E2EHandshake.version,
            clock: { Date().addingTimeInterval(offset.withLockedValue { $0 }) }
        )
    }

    static func health(_ client: OverlayClient) async throws -> Int {
        let response = try await client.stream(URLRequest(url: URL(string: "http://claude-api/health")!))
        for try await _ in response.body {}
        return response.response.statusCode
    }

    @Test("an identity due for renewal is renewed through the store, used at once, and the app is told")
    func renewedWhenDue() async throws {
        try await withClientCluster { cluster in
            let identity = try await cluster.enroll("tab", role: .device)
            let store = MemoryStore(identity)
            // 61 of its 90 days gone: less than a third left, so it is due.
            let offset = NIOLockedValueBox(61 * Self.day)
            let client = try OverlayClient(dialer: try Self.dialer(identity, offset: offset), store: store)
            #expect(await TestCluster.eventually { store.saved.count == 1 }, "the client did not renew by itself")
            let renewed = try #require(store.saved.first)
            #expect(renewed.identity.id == identity.identity.id)
            #expect(renewed.certificate != identity.certificate)
            #expect(renewed.privateKey != identity.privateKey, "a renewal makes a new key pair here")
            offset.withLockedValue { $0 = 0 }
            #expect(try await Self.health(client) == 200)
            #expect(try await client.renewIdentityIfDue() == false, "a fresh certificate is not due")

            // Due again: the app is told, with the identity it now uses.
            let told = NIOLockedValueBox<[IdentityFile]>([])
            client.onIdentityRenewed { file in told.withLockedValue { $0.append(file) } }
            offset.withLockedValue { $0 = 61 * Self.day }
            #expect(try await client.renewIdentityIfDue())
            offset.withLockedValue { $0 = 0 }
            #expect(told.withLockedValue { $0.map(\.certificate) } == [store.saved.last?.certificate])
            #expect(store.saved.count == 2)
            #expect(try await Self.health(client) == 200)
        }
    }

    @Test("a request made while the renewal is out waits for the new certificate instead of being refused with the old")
    func requestDuringRenewalWaits() async throws {
        try await withClientCluster { cluster in
            let identity = try await cluster.enroll("tab", role: .device)
            let dialer = try Self.dialer(identity, offset: NIOLockedValueBox(0))
            let client = OverlayClient(dialer: dialer)
            #expect(try await Self.health(client) == 200, "the old certificate's connection is open")
            let answered = NIOLockedValueBox<Int?>(nil)
            let request = NIOLockedValueBox<Task<Void, any Error>?>(nil)
            let renewed = try await dialer.renewIdentity { () throws(ILSError) -> IdentityFile in
                // The controller has issued the new certificate and refuses the old one from here on.
                let renewed = try await Renewal.renewed(identity)
                request.withLockedValue {
                    $0 = Task {
                        let status = try await Self.health(client)
                        answered.withLockedValue { $0 = status }
                    }
                }
                let waited = await TestCluster.eventually { dialer.waitedForRenewal == 1 }
                #expect(waited, "the request did not wait for the renewal")
                #expect(answered.withLockedValue { $0 } == nil)
                return renewed
            }
            try await #require(request.withLockedValue { $0 }).value
            #expect(answered.withLockedValue { $0 } == 200)
            #expect(dialer.identity.certificate == renewed.certificate)
        }
    }

    @Test("an expired identity is refused before any connection, with identity_expired and what to do; nothing saved")
    func expiredHasItsOwnReason() async throws {
        try await withClientCluster { cluster in
            let identity = try await cluster.enroll("tab", role: .device)
            let store = MemoryStore(identity)
            let offset = NIOLockedValueBox(91 * Self.day)
            let dialer = try Self.dialer(identity, offset: offset)
            let client = try OverlayClient(dialer: dialer, store: store)
            do {
                _ = try await Self.health(client)
                Issue.record("an expired identity got an answer")
            } catch let error as URLError {
                #expect(error.userInfo[OverlayURLError.reasonKey] as? String == "identity_expired")
                #expect(error.code == .userAuthenticationRequired)
                #expect(error.localizedDescription.contains("new enrollment token"), "\(error.localizedDescription)")
            }
            await #expect(throws: ILSError.self) { try await client.renewIdentityIfDue() }
            #expect(store.saved.isEmpty)
            #expect(!dialer.holdsConnection, "an expired identity still connected")
            if case .offline(code: "identity_expired", _) = dialer.linkState {
            } else {
                Issue.record("link state \(dialer.linkState)")
            }
        }
    }
}
