import Foundation
import ILSCore
import ILSCrypto
import ILSTesting
import NIOCore
import NIOHTTP1
import Testing

@testable import ILSClient

/// A request without a body leaves the app as one end-to-end record (head and end in one flush), not as the head's
/// record and then an empty one for the end: that second record was a second DATA frame, and a second wake-up of the
/// controller and the gateway, per GET.
@Suite("OverlayExchange: records per request", .clusterExclusive)
struct OverlayExchangeRecordTests {
    @Test("a body-less request crosses the relay as one record: exactly one empty record fewer than head, then end")
    func bodylessRequestIsOneRecord() async throws {
        try await withClientCluster { cluster in
            let client = try OverlayClient(identity: try await cluster.enroll("tab", role: .device))
            var head = HTTPRequestHead(version: .http1_1, method: .GET, uri: "/health")
            head.headers.add(name: "Host", value: "claude-api")

            // `.none`: the end goes with the head. An empty `.data` body takes the other way: the head, then the
            // end on its own, which the end-to-end layer seals as an empty record (the old behaviour for every GET).
            let together = try await Self.bytesFromDevice(cluster, client, head, body: .none)
            let apart = try await Self.bytesFromDevice(cluster, client, head, body: .data(Data()))
            let emptyRecord = 4 + E2ERecord.overhead  // the length prefix and the sealed empty plaintext
            // Either reading may also hold the device's ACK of the response (suite 5: sent 1 s after it, if the
            // circuit is still open then, which a slow run reaches): a whole number of ACK frames, never a record's.
            let ackFrame = 4 + E2ERecord.overhead + 8
            #expect(
                (apart - together - emptyRecord) % ackFrame == 0,
                "one record: \(together) bytes; head then end: \(apart)"
            )
        }
    }

    /// Runs one exchange on a circuit of its own and returns the bytes the relay carried from the device on it,
    /// read once two readings 100 ms apart agree.
    static func bytesFromDevice(
        _ cluster: TestCluster,
        _ client: OverlayClient,
        _ head: HTTPRequestHead,
        body: OverlayRequestBody
    ) async throws -> Int {
        try await waitUntilNoSession(cluster)
        let exchange = try await OverlayExchange.open(
            dialer: client.dialer,
            service: "claude-api",
            head: head,
            body: body,
            idleTimeout: .seconds(30)
        )
        defer { exchange.close() }
        try await exchange.send(body)
        var status: HTTPResponseStatus?
        while let part = try await exchange.next() {
            if case .head(let responseHead) = part { status = responseHead.status }
        }
        #expect(status == .ok)
        // Each reading is an admin call (a TLS connection of its own), so a few, spaced: the suite runs beside
        // others, under the sanitizers too, and a tight loop of handshakes starves them.
        var last = -1
        for _ in 0..<100 {
            // Sleep: no event says the relay has carried the device's last record; agreeing readings are the settle.
            try await Task.sleep(for: .milliseconds(100))
            let sessions: [ControllerAPI.Session] = try await cluster.admin().call(.GET, "/v1/admin/sessions")
            let bytes = try #require(sessions.first { $0.device == "tab" }).bytesFromDevice
            if bytes == last { return bytes }
            last = bytes
        }
        Issue.record("the relay's byte count did not settle")
        return last
    }

    /// The previous exchange's circuit is gone from the relay, so the next reading is of the new one.
    static func waitUntilNoSession(_ cluster: TestCluster) async throws {
        for _ in 0..<100 {
            let sessions: [ControllerAPI.Session] = try await cluster.admin().call(.GET, "/v1/admin/sessions")
            if !sessions.contains(where: { $0.device == "tab" }) { return }
            try await Task.sleep(for: .milliseconds(100))
        }
        Issue.record("a closed circuit stayed in the relay's sessions")
    }
}
