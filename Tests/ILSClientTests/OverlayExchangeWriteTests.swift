import Foundation
import ILSTesting
import NIOConcurrencyHelpers
import NIOCore
import NIOEmbedded
import NIOHTTP1
import Testing

@testable import ILSClient

/// An upload's writes wait for the circuit: each chunk goes once the one before was taken. The sender runs off the
/// circuit's loop; it used to wait only when `isWritable` said no, which, read right after a write merely queued on
/// the loop, still said yes: the whole body could be queued past the circuit's bound, and the gateway cut the circuit
/// for it (`e2e_window_exceeded`, which the app saw as `not_resumed`).
@Suite("OverlayExchange: an upload's pace")
struct OverlayExchangeWriteTests {
    /// Holds each write's promise until the test lets it go, and counts writes that came while one was held.
    final class HoldingWrites: ChannelOutboundHandler, Sendable {
        typealias OutboundIn = HTTPClientRequestPart

        struct State {
            var writes = 0
            var overlapping = 0
            var held: [EventLoopPromise<Void>] = []
        }

        let state = NIOLockedValueBox(State())

        func write(context: ChannelHandlerContext, data: NIOAny, promise: EventLoopPromise<Void>?) {
            state.withLockedValue { state in
                state.writes += 1
                if !state.held.isEmpty { state.overlapping += 1 }
                state.held.append(promise ?? context.eventLoop.makePromise())
            }
        }

        /// Lets the oldest held write go (on the loop, as a circuit that took it would).
        func release(on eventLoop: any EventLoop) {
            eventLoop.execute {
                let promise = self.state.withLockedValue { state in
                    state.held.isEmpty ? nil : state.held.removeFirst()
                }
                promise?.succeed()
            }
        }
    }

    @Test("a 1 MiB body goes as 16 chunks and an end, none written while the one before is still held")
    func oneWriteAtATime() async throws {
        let channel = NIOAsyncTestingChannel()
        let holder = HoldingWrites()
        try await channel.pipeline.addHandler(holder)
        let body = OverlayRequestBody.data(Data(count: 16 * OverlayExchange.chunkSize))
        let sending = Task { try await OverlayExchange.send(body, on: channel) }
        for written in 1...17 {
            // The event: the write numbered `written` has reached the circuit and is held there.
            let arrived = await TestCluster.eventually {
                holder.state.withLockedValue { $0.writes >= written && !$0.held.isEmpty }
            }
            try #require(arrived, "write \(written) never came")
            holder.release(on: channel.eventLoop)
        }
        try await sending.value
        let state = holder.state.withLockedValue { $0 }
        #expect(state.writes == 17)
        #expect(state.overlapping == 0, "\(state.overlapping) writes came while the one before was still held")
        _ = try? await channel.finish()
    }

}
