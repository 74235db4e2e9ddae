import Foundation
import ILSCore
import ILSFabric
import NIOConcurrencyHelpers
import NIOCore
import NIOEmbedded
import NIOHPACK
import NIOHTTP2
import Testing

@testable import ILSController

@Suite("A gateway's control stream: policy-only links and service names")
struct HostControlPolicyLinkTests {
    /// What a handler registered the link for, and what it answered.
    struct Outcome {
        var subscribed = 0
        var hosted: [String] = []
        var answer: String?
        var endStream = false
    }

    /// Runs one control stream: the gateway answers `headers`; returns what was registered and written back.
    func control(_ headers: HPACKHeaders, state: ControllerState) throws -> Outcome {
        let recorded = NIOLockedValueBox(Outcome())
        let channel = EmbeddedChannel()
        let handler = HostControlHandler(
            gateway: gatewayRecord(),
            controller: Controller(state: state),
            link: (0, 1),
            registration: .separate(
                subscribe: { _ in recorded.withLockedValue { $0.subscribed += 1 } },
                host: { service in recorded.withLockedValue { $0.hosted.append(service) } }
            )
        )
        try channel.pipeline.syncOperations.addHandler(handler)
        try channel.writeInbound(HTTP2Frame.FramePayload.headers(.init(headers: headers)))
        var outcome = recorded.withLockedValue { $0 }
        while let payload = try channel.readOutbound(as: HTTP2Frame.FramePayload.self) {
            if case .data(let data) = payload, case .byteBuffer(let body) = data.data {
                outcome.answer = String(buffer: body)
                outcome.endStream = data.endStream
            }
        }
        _ = try? channel.finish()
        return outcome
    }

    @Test("a policy-only link gets the policy and the pushes but is never registered for circuits")
    func policyOnly() async throws {
        let (state, directory) = try await temporaryControllerState()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let outcome = try control(
            [
                ":status": "200", FabricProtocol.serviceHeader: "claude-api",
                FabricProtocol.linkPurposeHeader: FabricProtocol.policyLink,
            ],
            state: state
        )
        #expect(outcome.subscribed == 1)
        #expect(outcome.hosted.isEmpty)
        let answer = try JSONDecoder().decode(HostControlMessage.self, from: Data(try #require(outcome.answer).utf8))
        #expect(answer.dialRoles != nil)
        #expect(answer.blocked != nil)
        #expect(answer.relayLoop == nil)
        #expect(!outcome.endStream)
    }

    @Test("a policy-only link's certificate checks are answered from the store; a hosting link's are ignored")
    func certificateChecks() async throws {
        let (state, directory) = try await temporaryControllerState()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let admin = try #require(try await state.store.identities().first { $0.role == .admin })
        for policyOnly in [true, false] {
            let channel = EmbeddedChannel()
            try channel.pipeline.syncOperations.addHandler(
                HostControlHandler(
                    gateway: gatewayRecord(),
                    controller: Controller(state: state),
                    link: (0, 1),
                    registration: .separate(subscribe: { _ in }, host: { _ in })
                )
            )
            var headers: HPACKHeaders = [":status": "200", FabricProtocol.serviceHeader: "claude-api"]
            if policyOnly { headers.add(name: FabricProtocol.linkPurposeHeader, value: FabricProtocol.policyLink) }
            try channel.writeInbound(HTTP2Frame.FramePayload.headers(.init(headers: headers)))
            while try channel.readOutbound(as: HTTP2Frame.FramePayload.self) != nil {}
            let checks = [
                CertificateCheck(check: 1, id: admin.id, fingerprint: admin.certificateFingerprint ?? ""),
                CertificateCheck(check: 2, id: admin.id, fingerprint: "replaced"),
                CertificateCheck(check: 3, id: "no-such-id", fingerprint: "x"),
            ]
            var lines = ""
            for check in checks { lines += String(decoding: try JSONEncoder().encode(check), as: UTF8.self) + "\n" }
            try channel.writeInbound(
                HTTP2Frame.FramePayload.data(.init(data: .byteBuffer(ByteBuffer(string: lines))))
            )
            var verdicts: [CertificateVerdict] = []
            while let payload = try channel.readOutbound(as: HTTP2Frame.FramePayload.self) {
                guard case .data(let data) = payload, case .byteBuffer(let body) = data.data else { continue }
                for line in String(buffer: body).split(separator: "\n") {
                    verdicts.append(try JSONDecoder().decode(CertificateVerdict.self, from: Data(line.utf8)))
                }
            }
            if policyOnly {
                #expect(verdicts.map(\.verdict) == [1, 2, 3])
                #expect(verdicts.map(\.allowed) == [admin.certificateFingerprint != nil, false, false])
                // The dial decision comes with an allowed answer only: the service's dial policy leaves admins out.
                #expect(verdicts.map(\.dial) == [false, nil, nil])
            } else {
                #expect(verdicts.isEmpty)
            }
            _ = try? channel.finish()
        }
    }

    @Test("a check's dial decision follows the service's dial policy as the directory holds it at the check")
    func dialDecisionFollowsThePolicy() async throws {
        let (state, directory) = try await temporaryControllerState()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let admin = try #require(try await state.store.identities().first { $0.role == .admin })
        let controller = Controller(state: state)
        let channel = EmbeddedChannel()
        try channel.pipeline.syncOperations.addHandler(
            HostControlHandler(
                gateway: gatewayRecord(),
                controller: controller,
                link: (0, 1),
                registration: .separate(subscribe: { _ in }, host: { _ in })
            )
        )
        try channel.writeInbound(
            HTTP2Frame.FramePayload.headers(
                .init(headers: [
                    ":status": "200", FabricProtocol.serviceHeader: "claude-api",
                    FabricProtocol.linkPurposeHeader: FabricProtocol.policyLink,
                ])
            )
        )
        while try channel.readOutbound(as: HTTP2Frame.FramePayload.self) != nil {}
        func ask(_ number: Int) throws -> CertificateVerdict? {
            let check = CertificateCheck(check: number, id: admin.id, fingerprint: admin.certificateFingerprint ?? "")
            var line = try JSONEncoder().encode(check)
            line.append(UInt8(ascii: "\n"))
            try channel.writeInbound(HTTP2Frame.FramePayload.data(.init(data: .byteBuffer(ByteBuffer(bytes: line)))))
            guard case .data(let data) = try channel.readOutbound(as: HTTP2Frame.FramePayload.self),
                case .byteBuffer(let body) = data.data
            else { return nil }
            return try JSONDecoder().decode(CertificateVerdict.self, from: Data(String(buffer: body).utf8.dropLast()))
        }
        #expect(try ask(1)?.dial == false)
        let service = try #require(state.identities.service(named: "claude-api"))
        _ = try await controller.updateService(
            named: "claude-api",
            ControllerAPI.ServiceRequest(
                dial: .init(semantic: .anyOf, tokens: ["role:device", "role:admin"]),
                revision: service.revision
            ),
            actor: "test"
        )
        let widened = try ask(2)
        #expect(widened?.allowed == true)
        #expect(widened?.dial == true)
        _ = try? channel.finish()
    }

    @Test("a hosting link is registered for pushes and circuits, as before")
    func hosting() async throws {
        let (state, directory) = try await temporaryControllerState()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let outcome = try control([":status": "200", FabricProtocol.serviceHeader: "claude-api"], state: state)
        #expect(outcome.subscribed == 1)
        #expect(outcome.hosted == ["claude-api"])
    }

    @Test(
        "a service name with terminal escapes is refused, nothing is registered, and the audit row shows it escaped",
        arguments: ["claude-api\u{1B}[2K\rforged line", "\u{1B}]0;title\u{07}", "a\u{202E}b", "../etc", ""]
    )
    func invalidServiceName(name: String) async throws {
        let (state, directory) = try await temporaryControllerState()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let outcome = try control([":status": "200", FabricProtocol.serviceHeader: name], state: state)
        #expect(outcome.subscribed == 0)
        #expect(outcome.hosted.isEmpty)
        #expect(outcome.endStream)
        let answer = try JSONDecoder().decode(HostControlMessage.self, from: Data(try #require(outcome.answer).utf8))
        #expect(answer.error?.contains("not valid") == true)
        #expect(answer.dialRoles == nil)
        // Written off the event loop (AuditQueue): the audit API flushes the queue before it reads, as here.
        await Controller(state: state).flushRefusals()
        let rows = try await state.store.auditEntries(since: 0).filter { $0.action == "bind.refused" }
        #expect(rows.count == 1)
        for row in rows {
            let text = row.actor + row.target + row.detail
            #expect(!text.unicodeScalars.contains { $0.value < 0x20 || $0.value == 0x7F || $0.value == 0x202E })
        }
    }
}
