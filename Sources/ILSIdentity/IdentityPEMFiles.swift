public import Foundation
public import ILSCore

/// The identity as three PEM files next to its identity file, for clients that cannot read an identity file
/// (curl, browsers, other TLS stacks talking to HTTP mode with client certificates):
///
/// ```
/// NAME.cert.pem   the identity certificate
/// NAME.key.pem    its Ed25519 private key, PKCS#8 (a copy of the identity file's)
/// NAME.ca.pem     the controller CA, to verify the server
/// ```
///
/// All three are written like the identity file: mode 0600, atomically, never over an existing file unless forced.
/// The key file is a second copy of the private key: it is written only when asked for (`enroll --pem`).
public enum IdentityPEMFiles {
    /// The three paths for an identity file at `identityPath` (`dir/NAME.json` → `dir/NAME.cert.pem` …).
    public static func paths(nextTo identityPath: String) -> [String] {
        let stem =
            identityPath.hasSuffix(".json") ? (identityPath as NSString).deletingPathExtension : identityPath
        return ["\(stem).cert.pem", "\(stem).key.pem", "\(stem).ca.pem"]
    }

    /// The contents, in the order of `paths`.
    public static func contents(of file: IdentityFile) -> [Data] {
        [file.certificate, file.privateKey, file.caCertificate].map { pem in
            Data((pem.hasSuffix("\n") ? pem : pem + "\n").utf8)
        }
    }
}
