import ArgumentParser
import ILSCore

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif

/// `ils-gateway`: one binary, one subcommand per role.
@main
struct ILSGatewayCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "ils-gateway",
        abstract: "A zero-trust gateway for a Claude Code backend.",
        discussion: """
            Serve a backend that streams answers (Server-Sent Events, WebSockets) to your devices.

            controller: the overlay controller (CA, identities, enrollment, admin API, relay).
            serve:      the gateway next to the backend (overlay mode: no listening port; or HTTP mode).
            enroll:     turn a one-time token into this machine's identity.
            tunnel:     a loopback proxy on the device into the overlay.
            admin:      manage identities.

            Exit status: 0 success, 64 bad arguments, 65 unreadable input file, 69 address or peer unavailable,
            70 internal error, 73 a file could not be written.
            """,
        version: "0.1.0",
        subcommands: [
            ControllerCommand.self, AdminCommand.self, EnrollCommand.self, ServeCommand.self, TunnelCommand.self,
            StatusCommand.self, RenewCommand.self,
        ]
    )

    /// Runs the command; an `ILSError` becomes one sentence on stderr and its exit status.
    static func main() async {
        do {
            var command = try parseAsRoot()
            if var asyncCommand = command as? any AsyncParsableCommand {
                try await asyncCommand.run()
            } else {
                try command.run()
            }
        } catch let error as ILSError {
            writeToStandardError("ils-gateway: \(error.reason)\n")
            Glibc.exit(error.code.exitCode)
        } catch {
            exit(withError: error)
        }
    }
}

func writeToStandardError(_ text: String) {
    var bytes = Array(text.utf8)
    _ = bytes.withUnsafeMutableBytes { write(2, $0.baseAddress, $0.count) }
}
