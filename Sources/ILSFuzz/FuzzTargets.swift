/// The fuzz targets: one entry per parser that reads network input, each driving the real code. A libFuzzer
/// harness (`Tests/Fuzz`) calls one per input; `ILSFuzzTests` replays the committed corpus and every past finding
/// through the same entries.
///
/// Every entry is deterministic for a given input and keeps no state between inputs (each builds its pipeline,
/// and the controller targets their store, afresh), so a finding replays alone and memory stays flat.
public enum FuzzTargets {
    /// A fuzz target's entry: one input, no result. It returns for any input; a crash or sanitizer report is a
    /// finding.
    public typealias Entry = @Sendable (UnsafeRawBufferPointer) -> Void

    /// Every target by name; the names are the corpus directories under `Tests/Fuzz/Corpus`.
    public static let all: [(name: String, entry: Entry)] = [
        ("fabric", fabric),
        ("e2e-handshake", e2eHandshake),
        ("e2e-records", e2eRecords),
        ("enrollment", enrollment),
        ("controller-api", controllerAPI),
        ("proxy-request", proxyRequest),
    ]

    /// A device's HTTP/2 overlay connection to the controller: circuits and their `u32`-length framing.
    public static func fabric(_ data: UnsafeRawBufferPointer) { FabricTarget.run(data) }

    /// The end-to-end handshake messages, read by the gateway (even first byte) or the device (odd).
    public static func e2eHandshake(_ data: UnsafeRawBufferPointer) { E2EHandshakeTarget.run(data) }

    /// The end-to-end record decoder with a fixed key: `header ‖ framed records`.
    public static func e2eRecords(_ data: UnsafeRawBufferPointer) { E2ERecordTarget.run(data) }

    /// `POST /v1/enroll` bodies and enrollment tokens.
    public static func enrollment(_ data: UnsafeRawBufferPointer) { EnrollmentTarget.run(data) }

    /// The controller's HTTP/1.1 API, admin endpoints included; the first byte picks the caller.
    public static func controllerAPI(_ data: UnsafeRawBufferPointer) { ControllerAPITarget.run(data) }

    /// HTTP/1.1 requests into the proxy core, with an in-process backend.
    public static func proxyRequest(_ data: UnsafeRawBufferPointer) { ProxyTarget.run(data) }
}
