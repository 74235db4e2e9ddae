import ArgumentParser
import Foundation
import ILSClient
import ILSCore
import ILSFabric
import NIOCore

#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// `ils-client-example stream`: the app's streaming request, through the overlay, with plain URLSession code.
struct StreamExampleCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "stream",
        abstract: "Send a request through the overlay with URLSession and print the answer line by line as it arrives.",
        discussion: """
            The request goes to http://SERVICE/PATH in a URLSession whose configuration routes the host SERVICE \
            through ILSClient: end-to-end encrypted to the gateway hosting SERVICE. GET, or POST with --data as a \
            JSON body. Each non-empty line of the answer is printed when it arrives, prefixed with the local arrival \
            time as HH:MM:SS.mmm. An HTTP error from the service prints its body on stderr and exits 76; an overlay \
            failure prints its reason (identity_blocked, unknown_service, ...) and exits with its status. The link \
            state (idle, connecting, ready, stalled, resuming, offline) is printed on stderr as it changes, as \
            'link: STATE'.
            """
    )

    @Option(help: "The identity file (from enroll).")
    var identity: String

    @Argument(help: "The path and query on the service, e.g. '/claude/stream?prompt=hi'.")
    var path: String

    @Option(help: "A JSON body: the request becomes a POST with Content-Type application/json.")
    var data: String?

    @Option(help: "The service to reach.")
    var service = "claude-api"

    @Option(
        help: """
            After this long with nothing received on the overlay connection, send a PING; a connection the network \
            dropped silently is then noticed, and the request's circuit resumed on a new one. Default: 25s.
            """
    )
    var keepalive = "25s"

    @Option(help: "Close the overlay connection when nothing arrives this long after its PING. Default: 10s.")
    var keepaliveTimeout = "10s"

    @Option(
        help: """
            Cancel the request (URLSessionTask.cancel()) once this many lines are printed, as an app whose user \
            stops an answer does: the gateway is told (a sealed CANCEL) and ends the backend request at once. Exits \
            0 after printing "cancelled after N lines" on stderr.
            """
    )
    var cancelAfter: Int?

    func validate() throws {
        guard path.hasPrefix("/") else { throw ValidationError("PATH must start with '/', e.g. /claude/stream") }
        if let cancelAfter, cancelAfter < 1 { throw ValidationError("--cancel-after must be at least 1") }
        guard !service.isEmpty, service.utf8.allSatisfy({ $0 > 0x20 && $0 < 0x7f && $0 != UInt8(ascii: "/") }) else {
            throw ValidationError("--service must be a service name such as claude-api")
        }
    }

    func run() async throws {
        guard let file = try FileIdentityStore(path: identity).load() else {
            throw ILSError(.invalidInput, "no identity file at \(identity); enroll first")
        }
        let interval = try TimeSpan(parsing: keepalive)
        let timeout = try TimeSpan(parsing: keepaliveTimeout)
        guard interval.nanoseconds >= 1_000_000_000, timeout.nanoseconds >= 1_000_000_000 else {
            throw ValidationError("--keepalive and --keepalive-timeout must be at least 1s")
        }
        let client = OverlayClient(
            dialer: try OverlayDialer(
                identity: file,
                keepalive: FabricKeepalive(
                    interval: .nanoseconds(interval.nanoseconds),
                    timeout: .nanoseconds(timeout.nanoseconds)
                )
            )
        )
        guard let url = URL(string: "http://\(service)\(path)") else {
            throw ValidationError("'\(path)' is not a valid path and query")
        }
        var request = URLRequest(url: url)
        request.setValue("text/event-stream, application/json", forHTTPHeaderField: "Accept")
        if let data {
            request.httpMethod = "POST"
            request.httpBody = Data(data.utf8)
            request.setValue("application/json", forHTTPHeaderField: "Content-Type")
        }
        // The link state on stderr as it changes ("link: ready", "link: stalled", ...): what an app's UI would show.
        let states = client.dialer.linkStates
        let watcher = Task {
            for await state in states { FileHandle.standardError.write(Data("link: \(state)\n".utf8)) }
        }
        defer { watcher.cancel() }
        let printer = LinePrinter(cancelAfter: cancelAfter)
        let session = URLSession(
            configuration: client.sessionConfiguration(services: [service]),
            delegate: printer,
            delegateQueue: printer.queue
        )
        let outcome = await printer.run(session.dataTask(with: request))
        session.invalidateAndCancel()
        // A cancelled task's CANCEL leaves in the background: exiting first would lose it, and the gateway would let
        // the backend run on for its grace window.
        _ = await client.circuitsEnded(within: .seconds(5))
        try outcome.get()
    }
}
