import ILSSplice
import NIOCore
import NIOPosix

#if canImport(Glibc)
import Glibc
#endif

/// A plain TCP relay on SwiftNIO, for the benchmark's floor rows: accepts on one port, connects each client to the
/// target and splices the two sockets with `GlueHandler` on the client's event loop (a half-close passes through). No
/// TLS, no HTTP/2, no end-to-end records: what is left is one NIO read and one NIO write per message per hop, the
/// least any relay hop built on NIO costs. `threads` event loops share the connections (one per core is what an HTTP
/// proxy runs with: nginx's `worker_processes auto`, HAProxy's `nbthread`, HTTP mode's loops).
enum PlainRelay {
    static func run(host: String, port: Int, target: Int, threads: Int) throws {
        let group = MultiThreadedEventLoopGroup(numberOfThreads: threads)
        let channel = try ServerBootstrap(group: group)
            .serverChannelOption(.backlog, value: 1024)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            .childChannelOption(.tcpOption(.tcp_nodelay), value: 1)
            .childChannelOption(.autoRead, value: false)
            .childChannelOption(.allowRemoteHalfClosure, value: true)
            .childChannelInitializer { client in
                ClientBootstrap(group: client.eventLoop)
                    .channelOption(.tcpOption(.tcp_nodelay), value: 1)
                    .channelOption(.allowRemoteHalfClosure, value: true)
                    .connect(host: host, port: target)
                    .flatMap { upstream in
                        let (toUpstream, toClient) = GlueHandler.matchedPair()
                        return client.eventLoop.makeCompletedFuture {
                            try client.pipeline.syncOperations.addHandler(toUpstream)
                            try upstream.pipeline.syncOperations.addHandler(toClient)
                            // Reads start once the pair is glued (nothing read before has anywhere to go).
                            try client.syncOptions?.setOption(.autoRead, value: true)
                        }.flatMapError { error in
                            upstream.close(promise: nil)
                            return client.eventLoop.makeFailedFuture(error)
                        }
                    }
            }
            .bind(host: host, port: port)
            .wait()
        print("ils-bench relay listening on \(channel.localAddress?.description ?? "?") to port \(target)")
        fflush(nil)
        try channel.closeFuture.wait()
    }
}
