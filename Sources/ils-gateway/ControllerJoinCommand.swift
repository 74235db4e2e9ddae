import ArgumentParser
import ILSController
import ILSCore
import ILSCrypto
import ILSIdentity

extension ControllerCommand {
    /// `ils-gateway controller join`: the state directory of a new replica of a running controller.
    struct Join: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "join",
            abstract: "Make a new controller replica: copy the cluster's CA and token key from a running controller.",
            discussion: """
                Run it on the new replica's machine, with an admin identity. The running controller (the admin \\
                identity's) must use a PostgreSQL store; the replica then runs with the same --store. The CA key and \\
                the token key come back sealed to a one-time key this command makes (HPKE), over the admin API's \\
                mutual TLS, pinned to the CA in the admin file: never in the clear. The replica's own TLS certificate \\
                is issued here, for --address. The join is in the audit log (controller.join).

                Example:
                  ils-gateway controller join --identity identities/admin.json \\
                      --address https://ctl-b.example.net:7443 --state-dir /var/lib/ils-controller/state
                  ils-gateway controller run --state-dir /var/lib/ils-controller/state --store postgres://…
                """
        )

        @OptionGroup var state: StateDirectory

        @Option(help: "An admin identity file; its controller is the one the secrets are copied from.")
        var identity: String = "identities/admin.json"

        @Option(help: "The URL devices and gateways will dial for this replica, https://HOST:PORT.")
        var address: String

        func run() async throws {
            let directory = try state.resolved()
            let address = try ControllerAddress(parsing: address)
            let file = try IdentityFileIO.read(identity)
            guard file.identity.role == .admin else {
                throw ILSError(
                    .invalidArgument,
                    "\(identity) is a \(file.identity.role.rawValue) identity; join needs an admin's"
                )
            }
            let opener = ControllerSecrets.Opener()
            let client = try ControllerClient(identityFile: file)
            let response = try await client.call(
                ControllerRoutes.clusterJoin,
                body: ControllerAPI.JoinRequest(
                    address: address.description,
                    publicKey: Base64URL.encode(opener.publicKey)
                )
            )
            // The CA must be the one this admin file pins: a controller cannot hand a replica another cluster's CA.
            guard PEMText.canonical(response.caCertificate) == PEMText.canonical(file.caCertificate) else {
                throw ILSError(.invalidInput, "the controller answered with a CA other than the one \(identity) pins")
            }
            guard let encapsulated = Base64URL.decode(response.encapsulatedKey),
                let sealed = Base64URL.decode(response.sealedSecrets)
            else { throw ILSError(.invalidInput, "the controller's sealed secrets are not base64url") }
            let secrets = try opener.open(
                encapsulatedKey: encapsulated,
                ciphertext: sealed,
                context: address.description
            )
            let files = try ControllerState.initializeReplica(
                directory: directory,
                address: address,
                caCertificatePEM: response.caCertificate,
                secrets: secrets
            )
            print("replica state created in \(directory) for \(files.address)")
            print("CA fingerprint (sha256): \(files.authority.fingerprint)")
            print("next: ils-gateway controller run --state-dir \(directory) --store <the cluster's postgres:// URL>")
        }
    }
}
