import ArgumentParser
import ILSCore
import ILSObservability

#if canImport(Glibc)
import Glibc
/// `exit(3)`, named apart from `ParsableCommand.exit(withError:)`.
private let systemExit = Glibc.exit
#elseif canImport(Musl)
import Musl
private let systemExit = Musl.exit
#elseif canImport(Darwin)
import Darwin
private let systemExit = Darwin.exit
#endif

/// `ils-gateway`: one binary, one subcommand per role.
@main
struct ILSGatewayCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "ils-gateway",
        abstract: "A zero-trust gateway for a Claude Code backend.",
        discussion: """
            Roles:
              controller  the overlay controller: CA, identities, enrollment,
                          admin API and relay, on one TLS port
              serve       the gateway next to the backend (overlay mode
                          listens on nothing; --mode http is a TLS proxy)
              enroll      turn a one-time token into this machine's identity
              tunnel      a loopback proxy on a device into the overlay
              admin       identities, sessions and the audit log
              status      who this identity is and whether it is accepted
              renew       a new certificate without a token

            Examples:
              ils-gateway controller init --state-dir ctl --address https://127.0.0.1:7443
              ils-gateway serve --config /etc/ils-gateway/gateway.yaml
              ils-gateway --generate-completion-script bash

            Exit status: 0 success, 64 bad arguments, 65 unreadable input,
            67 not found, 69 unreachable, 70 internal error, 73 cannot write,
            77 permission denied, 79 conflict, 80-88 enrollment refusals
            (see ils-gateway enroll --help), 90-94 config file refused
            (90 missing, 91 unreadable, 92 not YAML, 93 unknown or
            repeated key, 94 wrong type), 95-97 a circuit's end-to-end
            layer (95 handshake, 96 record, 97 window); every code in
            docs/operations.md, "Exit statuses".
            """,
        version: "0.1.0",
        subcommands: [
            ControllerCommand.self, AdminCommand.self, EnrollCommand.self, ServeCommand.self, TunnelCommand.self,
            StatusCommand.self, RenewCommand.self,
        ]
    )

    /// Runs the command; an `ILSError` becomes one sentence on stderr and its exit status.
    static func main() async {
        MemoryTuning.apply()
        // Access lines wait for the end of their event loop's turn (`LogWriter`); none is lost at exit.
        atexit { LogWriter.standardError.flushAll() }
        do {
            var command = try parseAsRoot()
            if var asyncCommand = command as? any AsyncParsableCommand {
                try await asyncCommand.run()
            } else {
                try command.run()
            }
        } catch let error as ILSError {
            // The sentence the command ends with is never one a stalled reader of stderr makes the writer drop.
            LogWriter.standardError.writeFinal(Array("ils-gateway: \(error.reason)\n".utf8))
            systemExit(error.code.exitCode)
        } catch {
            exit(withError: error)
        }
    }
}

/// Writes `text` to stderr now, whole, after any log lines still held.
func writeToStandardError(_ text: String) {
    LogWriter.standardError.write(Array(text.utf8), deferrable: false)
}
