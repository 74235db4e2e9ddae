import ArgumentParser
import ILSCore
import ILSIdentity

/// `ils-gateway renew`: replace this identity's certificate (and key) before it expires, without a token.
struct RenewCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "renew",
        abstract:
            "Renew this identity's certificate with a new key, without a token (serve and tunnel do it on start).",
        discussion: """
            Certificates last 90 days; serve and tunnel renew theirs when fewer than 30 days are left, each time they
            start. Run this by hand (or from a timer) for long-running processes. Example:
              ils-gateway renew --identity identities/ipad.json
            """
    )

    @Option(help: "The identity file. Env: ILS_IDENTITY. Default: identities/admin.json.")
    var identity: String?

    @Flag(help: "Renew even when the certificate is far from expiry.")
    var force = false

    func run() async throws {
        let path = identity ?? ProcessEnvironment()["ILS_IDENTITY"] ?? "identities/admin.json"
        let file = force ? try await Renewal.renew(path: path) : try await Renewal.renewIfDue(path: path)
        say("\(file.identity.name): certificate valid until \(formatTimeOfCertificate(file))")
    }
}

func formatTimeOfCertificate(_ file: IdentityFile) -> String {
    formatTime(file.identity.certificateNotAfter)
}
