import ArgumentParser
import ILSController
import ILSCore

extension ControllerCommand {
    /// `ils-gateway controller rotate-tls`: a new TLS certificate for the controller, optionally for a new address.
    struct RotateTLS: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "rotate-tls",
            abstract: "Give the controller a fresh TLS certificate from its CA, for its address or a new one.",
            discussion: """
                Identities keep working: they trust the controller's CA, not this certificate. The previous certificate \\
                is kept as server.pem.old. Restart the controller to serve the new one. With --address the controller \\
                moves to a new name: new tokens carry it, and existing devices and gateways move over with \\
                `admin identity reissue NAME` and `enroll --force` (docs/operations.md).

                Examples:
                  ils-gateway controller rotate-tls --state-dir /var/lib/ils-controller/state
                  ils-gateway controller rotate-tls --state-dir ctl --address https://ctl2.example.net:7443
                """
        )

        @OptionGroup var state: StateDirectory

        @Option(help: "Move the controller to this URL, https://HOST:PORT. Default: keep its address.")
        var address: String?

        func run() async throws {
            let directory = try state.resolved()
            let newAddress = try address.map { text throws(ILSError) in try ControllerAddress(parsing: text) }
            let rotated = try ControllerState.rotateServerCertificate(directory: directory, address: newAddress)
            print("new TLS certificate for \(rotated.address) written to \(directory)/server.pem")
            print("restart the controller to serve it (systemctl restart ils-controller)")
        }
    }
}
