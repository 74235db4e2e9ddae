import Foundation
import ILSCore
import NIOConcurrencyHelpers
import NIOCore
import NIOHTTP1

/// Gathers one HTTP response (bounded) and completes a promise with its status, body and the controller list it
/// names (`ControllerAddress.listHeader`).
final class ResponseCollector: ChannelInboundHandler {
    typealias InboundIn = HTTPClientResponsePart

    /// Hands the promise across the bootstrap's initializer, which runs before the caller holds the channel.
    final class Box: Sendable {
        private let promise = NIOLockedValueBox<EventLoopPromise<Answer>?>(nil)

        func promise(on eventLoop: any EventLoop) -> EventLoopPromise<Answer> {
            promise.withLockedValue { existing in
                if let existing { return existing }
                let created = eventLoop.makePromise(of: Answer.self)
                existing = created
                return created
            }
        }

        func future(on eventLoop: any EventLoop) -> EventLoopFuture<Answer> {
            promise(on: eventLoop).futureResult
        }
    }

    struct Answer: Sendable {
        var status: Int
        var body: Data
        /// The `ils-controllers` header's value, if the answer had one.
        var controllers: String?
    }

    enum Failure: Error, CustomStringConvertible {
        case tooLarge
        case closedEarly

        var description: String {
            switch self {
            case .tooLarge: "its answer was larger than \(ControllerClient.maximumResponseBytes) bytes"
            case .closedEarly: "it closed the connection before a whole answer"
            }
        }
    }

    private let box: Box
    private let limit: Int
    private var status = 0
    private var controllers: String?
    private var body = Data()
    private var done = false

    init(box: Box, limit: Int) {
        self.box = box
        self.limit = limit
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        switch unwrapInboundIn(data) {
        case .head(let head):
            status = Int(head.status.code)
            controllers = head.headers.first(name: ControllerAddress.listHeader)
        case .body(let buffer):
            guard body.count + buffer.readableBytes <= limit else {
                finish(context, .failure(Failure.tooLarge))
                context.close(promise: nil)
                return
            }
            body.append(contentsOf: buffer.readableBytesView)
        case .end:
            finish(context, .success(Answer(status: status, body: body, controllers: controllers)))
        }
    }

    func channelInactive(context: ChannelHandlerContext) {
        finish(context, .failure(Failure.closedEarly))
        context.fireChannelInactive()
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        finish(context, .failure(error))
        context.close(promise: nil)
    }

    private func finish(_ context: ChannelHandlerContext, _ result: Result<Answer, any Error>) {
        guard !done else { return }
        done = true
        box.promise(on: context.eventLoop).completeWith(result)
    }
}
