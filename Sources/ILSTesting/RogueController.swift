import Foundation
public import ILSController
public import ILSCore
import ILSCrypto
public import ILSFabric
import NIOConcurrencyHelpers
public import NIOCore
import NIOHPACK
import NIOHTTP2
import NIOPosix
import NIOSSL

/// A relay that does not check policies: it holds a TLS certificate from the real CA, lets a real gateway link to it,
/// tells the gateway what the test says, and opens circuits that no policy checked, with a device's own credentials.
/// What it proves is the gateway's own enforcement: whatever circuit a relay lets through, only the identities in
/// the grant the gateway holds get in. (A controller's keys themselves are trusted: one that sends a grant of its
/// own choosing is obeyed, as docs/threat-model.md says.)
public final class RogueController: Sendable {
    /// How a forged circuit's end-to-end handshake ended.
    public enum Outcome: Sendable, Equatable {
        /// The gateway completed the handshake: the circuit is open (and is closed when it ends).
        case established
        /// The gateway refused it, with this reason.
        case refused(String)
        /// The circuit ended another way (the stream was reset or closed without a handshake answer).
        case ended(String)
    }

    private struct Link {
        let channel: any Channel
        let multiplexer: NIOHTTP2Handler.StreamMultiplexer
        var control: (any Channel)?
        var service: String?
    }

    public let port: Int
    private let server: any Channel
    private let links: NIOLockedValueBox<[Link]>

    private init(links: NIOLockedValueBox<[Link]>, port: Int, server: any Channel) {
        self.links = links
        self.port = port
        self.server = server
    }

    /// Listens on a free loopback port with a server certificate the CA of `state` issued for 127.0.0.1.
    public static func start(state: ControllerState) async throws -> RogueController {
        let issued = try state.authority.issueServerCertificate(host: "127.0.0.1")
        var configuration = TLSConfiguration.makeServerConfiguration(
            certificateChain: try NIOSSLCertificate.fromPEMBytes(
                Array((issued.certificatePEM + "\n" + state.authority.certificatePEM).utf8)
            ).map { .certificate($0) },
            privateKey: .privateKey(try NIOSSLPrivateKey(bytes: Array(issued.privateKeyPEM.utf8), format: .pem))
        )
        configuration.minimumTLSVersion = .tlsv13
        configuration.trustRoots = .certificates(
            try NIOSSLCertificate.fromPEMBytes(Array(state.authority.certificatePEM.utf8))
        )
        configuration.certificateVerification = .optionalVerification
        configuration.verifySignatureAlgorithms = [.ed25519, .ecdsaSecp256R1Sha256]
        configuration.applicationProtocols = [FabricProtocol.hostALPN]
        let context = try NIOSSLContext(configuration: configuration)
        let links = NIOLockedValueBox<[Link]>([])
        let server = try await ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            .childChannelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    try channel.pipeline.syncOperations.addHandler(NIOSSLServerHandler(context: context))
                    let multiplexer = try channel.pipeline.syncOperations.configureFabricHTTP2(mode: .client)
                    let index = links.withLockedValue { links in
                        links.append(Link(channel: channel, multiplexer: multiplexer))
                        return links.count - 1
                    }
                    multiplexer.createStreamChannel { stream in
                        stream.eventLoop.makeCompletedFuture {
                            try stream.pipeline.syncOperations.addHandler(
                                RogueControlStream { service in
                                    links.withLockedValue {
                                        $0[index].control = stream
                                        $0[index].service = service
                                    }
                                }
                            )
                        }
                    }.whenFailure { _ in channel.close(promise: nil) }
                }
            }
            .bind(host: "127.0.0.1", port: 0).get()
        return RogueController(links: links, port: server.localAddress!.port!, server: server)
    }

    public var address: ControllerAddress {
        // A literal loopback address always parses.
        try! ControllerAddress(parsing: "https://127.0.0.1:\(port)")
    }

    /// The service the linked gateway said it hosts, once its control stream answered.
    public var hostedService: String? {
        links.withLockedValue { $0.lazy.compactMap(\.service).first }
    }

    /// Sends `message` on the gateway's control stream as one JSON line.
    public func send(_ message: HostControlMessage) async throws {
        guard let control = links.withLockedValue({ $0.lazy.compactMap(\.control).first }) else {
            throw ILSError(.unavailable, "no gateway has linked to the rogue controller")
        }
        var line = try JSONEncoder().encode(message)
        line.append(UInt8(ascii: "\n"))
        try await control.writeAndFlush(
            HTTP2Frame.FramePayload.data(.init(data: .byteBuffer(ByteBuffer(bytes: line))))
        ).get()
    }

    /// Opens a circuit to `service` on the linked gateway, without any policy check, and runs the end-to-end
    /// handshake with `device`'s own credentials. Returns the outcome and, when established, the circuit's channel.
    public func forgeCircuit(service: String, device: IdentityFile) async throws -> (Outcome, (any Channel)?) {
        guard let link = links.withLockedValue({ $0.first { $0.control != nil } }) else {
            throw ILSError(.unavailable, "no gateway has linked to the rogue controller")
        }
        let credentials = try E2EHandshake.Credentials(
            certificatePEM: device.certificate,
            privateKeyPEM: device.privateKey,
            caCertificatePEM: device.caCertificate
        )
        let opened = link.channel.eventLoop.makePromise(of: Void.self)
        let outcome = link.channel.eventLoop.makePromise(of: Outcome.self)
        let stream = try await link.multiplexer.createStreamChannel { stream in
            stream.eventLoop.makeCompletedFuture {
                try stream.pipeline.syncOperations.addHandler(
                    CircuitDialer(
                        service: service,
                        extraHeaders: [(FabricProtocol.deviceNameHeader, device.identity.name)],
                        opened: opened
                    )
                )
            }
        }.get()
        do {
            try await opened.futureResult.get()
        } catch {
            return (.ended("the gateway refused the stream: \(error)"), nil)
        }
        try await stream.eventLoop.submit {
            let pipeline = stream.pipeline.syncOperations
            try pipeline.addHandler(StreamDataCodec())
            try pipeline.addHandler(ByteToMessageHandler(FrameDecoder()))
            try pipeline.addHandler(E2EInitiatorHandler(credentials: credentials, service: service))
            try pipeline.addHandler(OutcomeRecorder(outcome: outcome))
        }.get()
        let result = try await outcome.futureResult.get()
        return (result, result == .established ? stream : nil)
    }

    public func stop() async {
        let channels = links.withLockedValue { $0.map(\.channel) }
        for channel in channels { try? await channel.close() }
        try? await server.close()
    }
}

/// The rogue's end of the control stream: asks what the gateway hosts and reports the answer.
private final class RogueControlStream: ChannelInboundHandler, Sendable {
    typealias InboundIn = HTTP2Frame.FramePayload
    typealias OutboundOut = HTTP2Frame.FramePayload

    private let answered: @Sendable (String) -> Void

    init(answered: @escaping @Sendable (String) -> Void) {
        self.answered = answered
    }

    func handlerAdded(context: ChannelHandlerContext) {
        let headers = HPACKHeaders([
            (":method", "GET"), (":scheme", "https"), (":authority", "controller"),
            (":path", FabricProtocol.controlPath),
        ])
        context.writeAndFlush(wrapOutboundOut(.headers(.init(headers: headers))), promise: nil)
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        if case .headers(let answer) = unwrapInboundIn(data),
            let service = answer.headers.first(name: FabricProtocol.serviceHeader)
        {
            answered(service)
        }
    }
}

/// Completes `outcome` with how the forged circuit's handshake ended (the first thing that happens).
private final class OutcomeRecorder: ChannelInboundHandler {
    typealias InboundIn = ByteBuffer

    private let outcome: EventLoopPromise<RogueController.Outcome>
    private var done = false

    init(outcome: EventLoopPromise<RogueController.Outcome>) {
        self.outcome = outcome
    }

    private func finish(_ result: RogueController.Outcome) {
        guard !done else { return }
        done = true
        outcome.succeed(result)
    }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        if event is E2EEstablishedEvent { finish(.established) }
        context.fireUserInboundEventTriggered(event)
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        if let refused = error as? E2EInitiatorHandler.Refused {
            finish(.refused(refused.reason))
        } else {
            finish(.ended("\(error)"))
        }
    }

    func channelInactive(context: ChannelHandlerContext) {
        finish(.ended("closed"))
        context.fireChannelInactive()
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        finish(.ended("removed"))
    }
}
