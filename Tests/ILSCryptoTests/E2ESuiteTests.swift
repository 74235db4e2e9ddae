import Foundation
import ILSCore
import ILSCrypto
import ILSSodium
import Testing

/// Which record protection a circuit runs, how device and gateway agree on it, and what the AES-GCM records refuse.
@Suite("End-to-end record suites")
struct E2ESuiteTests {
    static let v1 = E2EHandshakeLegacy(1)
    static let v2 = E2EHandshakeLegacy(2)

    /// A gateway's responder: every version, as `serve` runs it.
    static func gateway(_ parties: E2EParties, suites: Set<E2ESuite> = Set(E2ESuite.allCases)) -> E2EResponder {
        E2EResponder(credentials: parties.gateway, versions: E2EHandshakeVersions.all, suites: suites)
    }

    /// A whole handshake between a device offering `offered` (speaking `version`, version 2 unless a test says
    /// otherwise: these tests are about version 2's suite negotiation) and a gateway accepting `accepted`.
    static func handshake(
        _ parties: E2EParties,
        offered: [E2ESuite]? = nil,
        accepted: Set<E2ESuite> = Set(E2ESuite.allCases),
        version: any E2EHandshakeVersion = v2
    ) throws -> (device: E2ESession, gateway: E2ESession) {
        let initiator = E2EInitiator(
            credentials: parties.device,
            service: "claude-api",
            version: version,
            suites: offered
        )
        let responder = gateway(parties, suites: accepted)
        let serverHello = try responder.receiveClientHello(initiator.clientHello()).serverHello
        let (finished, device) = try initiator.receiveServerHello(serverHello)
        return (device, try responder.receiveClientFinished(finished))
    }

    static func exchange(_ sessions: (device: E2ESession, gateway: E2ESession)) throws {
        let request = Array("GET /claude/stream HTTP/1.1\r\n\r\n".utf8)
        #expect(try sessions.gateway.receiver.open(sessions.device.sender.seal(request)).plaintext == request)
        let answer = [UInt8](repeating: 0x61, count: 70_000)
        let opened = try sessions.device.receiver.open(sessions.gateway.sender.seal(answer, final: true))
        #expect(opened.plaintext == answer && opened.final)
    }

    @Test("a version 2 device and a gateway agree on AES-256-GCM, the device's first choice")
    func defaultIsAESGCM() throws {
        let sessions = try Self.handshake(try E2EParties())
        #expect(sessions.device.suite == .aes256gcm)
        #expect(sessions.gateway.suite == .aes256gcm)
        try Self.exchange(sessions)
    }

    @Test(
        "a device of this build speaks version 3, offers suites 5, 4 and 3, and agrees suite 5 (resumable) with a gateway"
    )
    func versionThreeIsTheDefault() throws {
        let parties = try E2EParties()
        let initiator = E2EInitiator(credentials: parties.device, service: "claude-api")
        let hello = initiator.clientHello()
        #expect(hello[1] == 3)
        #expect(
            Array(hello.suffix(5)) == [
                0, 3, E2ESuite.aes256gcmHKDFResume.rawValue, E2ESuite.aes256gcmHKDFCancel.rawValue,
                E2ESuite.aes256gcmHKDF.rawValue,
            ]
        )
        let responder = Self.gateway(parties)
        let serverHello = try responder.receiveClientHello(hello).serverHello
        #expect(serverHello[1] == 3 && serverHello[2] == E2ESuite.aes256gcmHKDFResume.rawValue)
        let (finished, device) = try initiator.receiveServerHello(serverHello)
        let gateway = try responder.receiveClientFinished(finished)
        #expect(device.suite == .aes256gcmHKDFResume && gateway.suite == .aes256gcmHKDFResume)
        // Both ends derive the same resumption secrets; the relay, which sees neither key, cannot.
        #expect(device.resume?.circuitID == gateway.resume?.circuitID && device.resume != nil)
        try Self.exchange((device, gateway))
        // A gateway of the previous release (suites 4 and 3) agrees suite 4, and nothing is resumable.
        let previous = E2EResponder(
            credentials: parties.gateway,
            versions: [E2EHandshake.version],
            suites: [.aes256gcmHKDFCancel, .aes256gcmHKDF]
        )
        let initiator4 = E2EInitiator(credentials: parties.device, service: "claude-api")
        let answer4 = try previous.receiveClientHello(initiator4.clientHello()).serverHello
        let (finished4, device4) = try initiator4.receiveServerHello(answer4)
        #expect(device4.suite == .aes256gcmHKDFCancel && device4.resume == nil)
        #expect(try previous.receiveClientFinished(finished4).resume == nil)
        // ILSCrypto alone (what ILSClient links) answers version 3 and nothing older.
        let v3Only = E2EResponder(credentials: parties.gateway)
        #expect(throws: ILSError.self) {
            _ = try v3Only.receiveClientHello(
                E2EInitiator(credentials: parties.device, service: "claude-api", version: Self.v2).clientHello()
            )
        }
    }

    @Test("a version 3 hello offering a version 2 suite is refused: each version agrees only its own suites")
    func versionThreeRefusesOldSuites() throws {
        let parties = try E2EParties()
        var hello = E2EInitiator(credentials: parties.device, service: "claude-api").clientHello()
        hello[hello.count - 3] = E2ESuite.aes256gcm.rawValue
        hello[hello.count - 2] = E2ESuite.aes256gcm.rawValue
        hello[hello.count - 1] = E2ESuite.aes256gcm.rawValue
        #expect(throws: ILSError.self) { _ = try Self.gateway(parties).receiveClientHello(hello) }
    }

    @Test("version 2 devices and gateways agree keys over and over")
    func legacyKeysAgree() throws {
        for _ in 0..<4 {
            let (device, gateway) = try Self.handshake(try E2EParties())
            // Both ends agree, and the keys differ per direction: the records open across and not back.
            let record = device.sender.seal([1, 2, 3])
            #expect(try gateway.receiver.open(record).plaintext == [1, 2, 3])
        }
    }

    @Test("the gateway takes the first suite of the device's offer that it accepts")
    func deviceOrderWins() throws {
        let parties = try E2EParties()
        let preferChaCha = try Self.handshake(parties, offered: [.xchacha20poly1305, .aes256gcm])
        #expect(preferChaCha.device.suite == .xchacha20poly1305 && preferChaCha.gateway.suite == .xchacha20poly1305)
        try Self.exchange(preferChaCha)
        let chachaGateway = try Self.handshake(parties, accepted: [.xchacha20poly1305])
        #expect(chachaGateway.device.suite == .xchacha20poly1305 && chachaGateway.gateway.suite == .xchacha20poly1305)
        try Self.exchange(chachaGateway)
    }

    @Test("a device offering nothing the gateway accepts is refused before any key is made")
    func noCommonSuite() throws {
        let parties = try E2EParties()
        let initiator = E2EInitiator(
            credentials: parties.device,
            service: "claude-api",
            version: Self.v2,
            suites: [.aes256gcm]
        )
        let responder = Self.gateway(parties, suites: [.xchacha20poly1305])
        #expect(throws: ILSError.self) { _ = try responder.receiveClientHello(initiator.clientHello()) }
        // Unknown suite numbers alone are no offer either.
        var hello = initiator.clientHello()
        hello[hello.count - 1] = 0xEE
        #expect(throws: ILSError.self) {
            _ = try Self.gateway(parties).receiveClientHello(hello)
        }
    }

    @Test("a device of handshake version 1 still gets a circuit, on secretstream records")
    func versionOneDevice() throws {
        let parties = try E2EParties()
        let sessions = try Self.handshake(parties, version: Self.v1)
        #expect(sessions.device.suite == .xchacha20poly1305 && sessions.gateway.suite == .xchacha20poly1305)
        try Self.exchange(sessions)
        // Its hello has no suite list, and the answer has no suite byte: exactly version 1's layout.
        let initiator = E2EInitiator(credentials: parties.device, service: "claude-api", version: Self.v1)
        let hello = initiator.clientHello()
        #expect(hello[1] == 1)
        let serverHello = try Self.gateway(parties).receiveClientHello(hello).serverHello
        #expect(serverHello[1] == 1)
        let certificateLength = Int(serverHello[2]) << 8 | Int(serverHello[3])
        #expect(serverHello.count == 4 + certificateLength + 32 + 32 + 64 + 24)
    }

    @Test("a relay that strips the suite list (version 2 → 1) or reorders it is caught by the device")
    func downgradeFails() throws {
        let parties = try E2EParties()
        let initiator = E2EInitiator(credentials: parties.device, service: "claude-api", version: Self.v2)
        let hello = initiator.clientHello()
        // Strip: the relay rewrites the hello as version 1 without the suite list (u16 count + 2 suites).
        var stripped = Array(hello.dropLast(4))
        stripped[1] = 1
        let oldAnswer = try Self.gateway(parties).receiveClientHello(stripped).serverHello
        #expect(throws: ILSError.self) { _ = try initiator.receiveServerHello(oldAnswer) }

        // Reorder: the gateway then picks secretstream, but the device signed-for transcript has its own order.
        let second = E2EInitiator(credentials: parties.device, service: "claude-api", version: Self.v2)
        var reordered = second.clientHello()
        reordered.swapAt(reordered.count - 1, reordered.count - 2)
        let responder = Self.gateway(parties)
        let answer = try responder.receiveClientHello(reordered).serverHello
        #expect(answer[2] == E2ESuite.xchacha20poly1305.rawValue)
        #expect(throws: ILSError.self) { _ = try second.receiveServerHello(answer) }
    }

    @Test("a relay that changes the gateway's choice is caught by the device")
    func changedChoiceFails() throws {
        let parties = try E2EParties()
        for (offered, forged) in [
            ([E2ESuite.aes256gcm, .xchacha20poly1305], E2ESuite.xchacha20poly1305),
            ([E2ESuite.aes256gcm], E2ESuite.xchacha20poly1305),
        ] {
            let initiator = E2EInitiator(
                credentials: parties.device,
                service: "claude-api",
                version: Self.v2,
                suites: offered
            )
            var answer = try Self.gateway(parties).receiveClientHello(initiator.clientHello()).serverHello
            #expect(answer[2] == E2ESuite.aes256gcm.rawValue)
            answer[2] = forged.rawValue
            answer += [UInt8](repeating: 0, count: forged.headerLength)  // so only the choice is wrong, not the length
            #expect(throws: ILSError.self) { _ = try initiator.receiveServerHello(answer) }
        }
    }

    @Test(
        "AES-GCM records: altered bytes, flags, reordering, replay, other direction and after FINAL are refused",
        arguments: [UInt8(2), 3]
    )
    func aesRecordRefusals(version: UInt8) throws {
        let parties = try E2EParties()
        let speaking: any E2EHandshakeVersion = version == 3 ? E2EHandshakeV3() : Self.v2
        func sessions() throws -> (device: E2ESession, gateway: E2ESession) {
            try Self.handshake(parties, version: speaking)
        }

        let s1 = try sessions()
        let record = s1.device.sender.seal(Array("hello".utf8))
        #expect(record.count == 5 + E2ERecord.overhead)
        #expect(!record.contains(subsequence: Array("hello".utf8)))
        for index in record.indices {
            let fresh = try sessions()
            let good = fresh.device.sender.seal(Array("hello".utf8))
            var bad = good
            bad[index] ^= 0x01
            #expect(throws: ILSError.self) { _ = try fresh.gateway.receiver.open(bad) }
        }
        // Marking an ordinary record FINAL (or setting an unknown flag bit) breaks it.
        for flags: UInt8 in [0x01, 0x02, 0x80] {
            let fresh = try sessions()
            var marked = fresh.device.sender.seal([1, 2, 3])
            marked[0] = flags
            #expect(throws: ILSError.self) { _ = try fresh.gateway.receiver.open(marked) }
        }
        // A record of one direction does not open in the other.
        let s2 = try sessions()
        #expect(throws: ILSError.self) { _ = try s2.device.receiver.open(s2.device.sender.seal([7])) }
        // Reordered, replayed, and after FINAL.
        let s3 = try sessions()
        let first = s3.device.sender.seal([1])
        let second = s3.device.sender.seal([2])
        #expect(throws: ILSError.self) { _ = try s3.gateway.receiver.open(second) }
        let s4 = try sessions()
        let once = s4.device.sender.seal([1])
        _ = try s4.gateway.receiver.open(once)
        #expect(throws: ILSError.self) { _ = try s4.gateway.receiver.open(once) }
        let s5 = try sessions()
        #expect(try s5.gateway.receiver.open(s5.device.sender.seal([9], final: true)).final)
        #expect(throws: ILSError.self) { _ = try s5.gateway.receiver.open(s5.device.sender.seal([10])) }
        // A receiver that refused one record opens nothing more, not even the right next one.
        let s6 = try sessions()
        let good = s6.device.sender.seal([1])
        var bad = good
        bad[bad.count - 1] ^= 1
        #expect(throws: ILSError.self) { _ = try s6.gateway.receiver.open(bad) }
        #expect(throws: ILSError.self) { _ = try s6.gateway.receiver.open(good) }
        _ = first
    }

    @Test("AES-GCM keys change every recordsPerKey records, at the same record on both ends")
    func keyChange() throws {
        let key = [UInt8](repeating: 0x11, count: 32)
        let sender = E2ERecordSuites.sender(.aes256gcm, key: key, recordsPerKey: 3)
        let records = (0..<10).map { sender.seal([UInt8($0)], final: $0 == 9) }
        let receiver = try E2ERecordSuites.receiver(.aes256gcm, key: key, header: [], recordsPerKey: 3)
        for (index, record) in records.enumerated() {
            #expect(try receiver.open(record).plaintext == [UInt8(index)])
        }
        #expect(receiver.finished)
        // A receiver that never changes its key opens the first three records and refuses the fourth: the key did
        // change there.
        let stale = try E2ERecordSuites.receiver(.aes256gcm, key: key, header: [], recordsPerKey: 1 << 40)
        for record in records.prefix(3) { _ = try stale.open(record) }
        #expect(throws: ILSError.self) { _ = try stale.open(records[3]) }
    }

    /// Known answers computed with another implementation (Python's `cryptography` AESGCM and `hashlib.blake2b`, from
    /// docs/protocol.md alone): a compatible client can check itself against these.
    @Test("AES-GCM records match the protocol's known answers, across a key change")
    func knownAnswers() throws {
        let key = [UInt8](repeating: 0x11, count: 32)
        let sender = E2ERecordSuites.sender(.aes256gcm, key: key, recordsPerKey: 2)
        // FINAL last, as a sender must send it; the third record is sealed under the changed key.
        let records = [
            sender.seal(Array("hi".utf8)), sender.seal(Array("x".utf8)), sender.seal([], final: true),
        ]
        #expect(
            records.map(Self.hex) == [
                "003ac33e5a388d40deb9ecd30db3dbdaaa4d62", "003dcfe519bdd7e548651aac54385e563740",
                "018ddc56fdc4e6da56a36110e2e8e44d31",
            ]
        )
        let receiver = try E2ERecordSuites.receiver(.aes256gcm, key: key, header: [], recordsPerKey: 2)
        for record in records { _ = try receiver.open(record) }
    }

    static func hex(_ bytes: [UInt8]) -> String { bytes.map { String(format: "%02x", $0) }.joined() }

    @Test("an AES-GCM receiver refuses a header, and a secretstream one a header of the wrong length")
    func headers() {
        let key = [UInt8](repeating: 0x22, count: 32)
        #expect(throws: ILSError.self) { _ = try E2ERecordSuites.receiver(.aes256gcm, key: key, header: [0]) }
        #expect(throws: ILSError.self) {
            _ = try E2ERecordSuites.receiver(.xchacha20poly1305, key: key, header: [UInt8](repeating: 0, count: 12))
        }
        #expect(E2ERecordSuites.sender(.aes256gcm, key: key).header.isEmpty)
        #expect(E2ERecordSuites.sender(.aes256gcmHKDF, key: key).header.isEmpty)
        #expect(E2ERecordSuites.sender(.xchacha20poly1305, key: key).header.count == 24)
    }
}
