import ILSCore
import ILSCrypto

/// Enrollment: the input is the body of `POST /v1/enroll` (`{"token", "publicKey", "proof"}`), sent to a fresh
/// controller that holds the device's unused token. The same bytes are also read as a bare token by
/// `EnrollmentToken` (what `ils-gateway enroll` does before it touches the network).
enum EnrollmentTarget {
    static func run(_ data: UnsafeRawBufferPointer) {
        let text = String(decoding: data, as: UTF8.self)
        _ = try? EnrollmentToken.parse(text)
        _ = try? EnrollmentToken.verify(
            text,
            publicKey: FuzzFixtures.shared.tokenKey.publicKey,
            now: Int64(FuzzFixtures.now.timeIntervalSince1970)
        )
        var request = Array(
            "POST \(ControllerEndpoint.enroll.path()) HTTP/1.1\r\nHost: 127.0.0.1:8443\r\nContent-Type: application/json\r\n"
                .utf8
        )
        request += Array("Content-Length: \(data.count)\r\n\r\n".utf8)
        request += Array(data)
        request.withUnsafeBytes { ControllerAPITarget.exchange($0, clientCertificate: nil) }
    }
}
