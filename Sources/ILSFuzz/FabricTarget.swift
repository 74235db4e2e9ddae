import ILSFabric
import NIOCore
import NIOEmbedded
import NIOHPACK
import NIOHTTP2

/// A device's overlay connection as the controller reads it after TLS: HTTP/2 with the fabric's settings, each
/// stream a circuit request (`CircuitAcceptor`), an accepted circuit's DATA turned into bytes (`StreamDataCodec`)
/// and split into frames (`FrameDecoder`).
///
/// Every circuit is accepted without asking a relay, so the fuzzer reaches the circuit framing; the relay's own
/// decision (policy, picking a gateway) reads no network bytes.
enum FabricTarget {
    static func run(_ data: UnsafeRawBufferPointer) {
        let channel = EmbeddedChannel()
        do {
            try channel.pipeline.syncOperations.configureFabricHTTP2(mode: .server) {
                CircuitAcceptor(decide: acceptEveryCircuit)
            }
            try channel.pipeline.syncOperations.addHandler(FabricConnectionErrorHandler())
        } catch {
            fatalError("the fabric pipeline could not be set up: \(error)")
        }
        channel.serve(data)
    }

    @Sendable private static func acceptEveryCircuit(
        _ service: String,
        _ headers: HPACKHeaders,
        _ stream: any Channel
    ) -> EventLoopFuture<CircuitDecision> {
        stream.eventLoop.makeSucceededFuture(
            .accept { pipeline in
                try pipeline.addHandler(StreamDataCodec())
                try pipeline.addHandler(ByteToMessageHandler(FrameDecoder()))
            }
        )
    }
}
