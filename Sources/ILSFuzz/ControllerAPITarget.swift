import ILSController
import ILSCore
import NIOCore
import NIOEmbedded

/// The controller's JSON API as a client reaches it after TLS: raw HTTP/1.1 bytes into the API pipeline
/// (`ControllerServer`'s head limits, `ControllerHTTPHandler`, `ControllerRouter`, `Controller`), against a fresh
/// in-memory store per input.
///
/// The first byte picks who is calling, as TLS would have verified it: nobody, the admin, or an enrolled gateway.
enum ControllerAPITarget {
    static func run(_ data: UnsafeRawBufferPointer) {
        guard let caller = data.first else { return }
        let fixtures = FuzzFixtures.shared
        let certificate: [UInt8]? =
            switch caller % 3 {
            case 0: nil
            case 1: fixtures.admin.certificateDER
            default: fixtures.gateway.certificateDER
            }
        exchange(UnsafeRawBufferPointer(rebasing: data.dropFirst()), clientCertificate: certificate)
    }

    /// Feeds `bytes` to a fresh controller's API connection and lets it answer.
    static func exchange(_ bytes: UnsafeRawBufferPointer, clientCertificate: [UInt8]?) {
        let channel = EmbeddedChannel()
        do {
            let server = try ControllerServer(
                state: try FuzzFixtures.shared.controllerState(),
                listen: HostPort(host: "127.0.0.1", port: 8443),
                logger: FuzzFixtures.logger
            )
            try server.configureAPIConnection(channel.pipeline.syncOperations, clientCertificate: clientCertificate)
        } catch {
            fatalError("the controller API pipeline could not be set up: \(error)")
        }
        channel.serve(bytes)
    }
}
