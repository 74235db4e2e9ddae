public import ILSDial
public import ILSIdentity

// The identity's life after enrollment lives in ILSIdentity, below both the device and the gateway, so that
// server-side roles renew and follow their identity without importing the app's library. An app still imports only
// ILSClient: these names are its API, the same types under the same names as before the move.
//
// Type aliases rather than `@_exported public import ILSIdentity`: they name exactly what the app is offered, with no
// underscored attribute. The cost: where a file imports both modules, Swift prefers the importing module's name
// (ILSClient's alias), so a module that imports ILSClient without `public` cannot use these names in its public
// declarations; such a module spells them `ILSIdentity.ControllerClient` or imports ILSIdentity alone.
// (`IdentityFile` is ILSCore's and is not aliased here for that reason: public initialisers taking one, such as
// `Tunnel`'s, would stop compiling.)

/// Reads and writes identity files, mode 0600, atomically.
public typealias IdentityFileIO = ILSIdentity.IdentityFileIO
/// Renews the certificate over mTLS with the current one.
public typealias Renewal = ILSIdentity.Renewal
/// The controller API client: mTLS with an identity, or pinned to a token's CA fingerprint while enrolling.
public typealias ControllerClient = ILSIdentity.ControllerClient
/// Keeps a long-running process's identity current: renews when due, follows the identity file.
public typealias IdentityKeeper = ILSIdentity.IdentityKeeper
/// Notices a certificate renewed in the identity file by someone else.
public typealias IdentityFileWatcher = ILSIdentity.IdentityFileWatcher
/// Reads an enrollment token and enrolls: a key pair made here, the certificate from the controller.
public typealias Enrollment = ILSIdentity.Enrollment
/// The PEM files written next to an identity file for tools that want them (`enroll --pem`).
public typealias IdentityPEMFiles = ILSIdentity.IdentityPEMFiles
/// The device's controller connection and circuits, without Foundation's networking (ILSDial, which the tunnel
/// uses too).
public typealias OverlayDialer = ILSDial.OverlayDialer
/// What the link to the overlay is doing, for a UI.
public typealias LinkState = ILSDial.LinkState
