import ILSClient
import ILSCore
import ILSTesting
import NIOCore
import Testing

/// A controller that hangs and one that hangs up are different faults, and the client's error says which: an operator
/// reading "closed early" would look for a crash when the controller (or the path to it) is only slow.
@Suite("What the controller client says when no answer comes")
struct ControllerClientDeadlineTests {
    @Test("a controller that never answers is reported as not answering within the client's deadline")
    func silentControllerIsATimeout() async throws {
        try await ControllerFixture.with { fixture in
            let silent = try await TestHangUpServer(silent: true)
            var client = ControllerClient(
                address: try ControllerAddress(parsing: "https://127.0.0.1:\(silent.port)"),
                trust: .certificateAuthority(fixture.state.authority.certificatePEM)
            )
            client.timeout = .seconds(1)
            let error = await #expect(throws: ILSError.self) {
                let _: ControllerAPI.AuditPage = try await client.call(.GET, "/v1/admin/audit")
            }
            #expect(error?.code == .unavailable)
            #expect(error?.reason == "the controller at https://127.0.0.1:\(silent.port) did not answer within 1 s")
            #expect(silent.connectionsAccepted == 1)
            await silent.stop()
        }
    }

    @Test("a controller that hangs up is reported as having closed, not as a timeout")
    func hangUpIsNotATimeout() async throws {
        try await ControllerFixture.with { fixture in
            let hangUp = try await TestHangUpServer()
            let client = ControllerClient(
                address: try ControllerAddress(parsing: "https://127.0.0.1:\(hangUp.port)"),
                trust: .certificateAuthority(fixture.state.authority.certificatePEM)
            )
            let error = await #expect(throws: ILSError.self) {
                let _: ControllerAPI.AuditPage = try await client.call(.GET, "/v1/admin/audit")
            }
            #expect(error?.code == .unavailable)
            let reason = error?.reason ?? ""
            #expect(reason.hasPrefix("the controller at https://127.0.0.1:\(hangUp.port) did not answer: "))
            #expect(!reason.contains("within"))
            await hangUp.stop()
        }
    }
}
