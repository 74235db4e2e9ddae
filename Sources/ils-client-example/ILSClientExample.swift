import ArgumentParser
import Foundation
import ILSCore

/// `ils-client-example`: what the app does, from a terminal: enroll from a token, then stream an answer with
/// URLSession through ILSClient.
@main
struct ILSClientExample: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "ils-client-example",
        abstract: "An example client of the overlay: enrolls, then streams with URLSession through ILSClient.",
        discussion: """
            Commands:
              enroll  turn a one-time token (pasted, or in a file) into an
                      identity file (mode 0600, written atomically)
              stream  send a request to a service through the overlay and
                      print each line of the answer as it arrives

            Examples:
              ils-client-example enroll ipad.jwt --out ipad.json
              ils-client-example stream --identity ipad.json '/claude/stream?prompt=hi&n=5'
              ils-client-example stream --identity ipad.json /claude/stream --data '{"prompt": "hi"}'

            Exit status: 0 success, 64 bad arguments, 65 unreadable identity
            or token, 69 overlay unreachable (controller_unreachable,
            service_unavailable), 67 unknown_service, 73 cannot write,
            74 stream cut short (truncated), 75 timed out, 76 the service
            answered an HTTP error, 77 refused (identity_blocked,
            dial_denied, gateway_denied), 79 output file exists,
            80-88 enrollment refusals (as ils-gateway enroll).
            """,
        subcommands: [EnrollExampleCommand.self, StreamExampleCommand.self]
    )

    /// Runs the command; a failure becomes one sentence on stderr and a distinct exit status.
    static func main() async {
        do {
            var command = try parseAsRoot()
            if var asyncCommand = command as? any AsyncParsableCommand {
                try await asyncCommand.run()
            } else {
                try command.run()
            }
        } catch let error as ILSError {
            ExampleOutput.fail(error.reason, status: error.code.exitCode)
        } catch let error as ExampleFailure {
            ExampleOutput.fail(error.sentence, status: error.status)
        } catch {
            exit(withError: error)
        }
    }
}
