public import NIOHTTP2

/// The names the overlay's connections and circuit streams use on the wire (docs/protocol.md, "Data plane").
public enum FabricProtocol {
    /// ALPN of a device's connection to the controller: HTTP/2, the controller is the server, one CONNECT stream per
    /// circuit.
    public static let dialALPN = "ils-dial/1"
    /// The same, where a circuit's first DATA (the device's end-to-end ClientHello) may follow its `CONNECT` at once,
    /// before the answer: one round trip less per circuit (docs/protocol.md, "Opening a circuit"). A device offers
    /// both, this one first; a controller that speaks it prefers it; either end of an earlier release has only
    /// `dialALPN`, and then the device waits for the answer as before.
    public static let dialEarlyALPN = "ils-dial/2"
    /// ALPN of a gateway's connection to the controller: HTTP/2 with roles reversed (the gateway dials out but is
    /// the HTTP/2 server; the controller opens a stream per circuit), as cloudflared does.
    public static let hostALPN = "ils-host/1"
    /// ALPN of the controller's JSON API.
    public static let apiALPN = "http/1.1"

    /// Response headers that explain a refused circuit.
    public static let errorHeader = "ils-error"
    public static let reasonHeader = "ils-reason"
    /// Informational headers the controller adds when it opens a circuit to a gateway. The gateway never trusts
    /// them; it learns who the device is from the end-to-end handshake.
    public static let deviceNameHeader = "ils-device-name"
    /// On a device's `CONNECT`: the stream resumes a held circuit (docs/protocol.md, "Resuming a circuit"), whose
    /// gateway is the identity id given. The relay sends it only to that gateway's links, with the header as it came
    /// and `deviceIDHeader`.
    public static let resumeHeader = "ils-resume"
    /// The RST_STREAM error code with which the relay ends a circuit stream whose device the service's dial policy no
    /// longer allows (a narrowed policy, a deleted service): "ILS" and 1. The device ends the circuit with
    /// `dial_denied` instead of taking the reset for a lost path and resuming (docs/protocol.md, "Ending a circuit").
    public static let dialDeniedReset = HTTP2ErrorCode(networkCode: 0x494C_5301)
    /// The device's identity id, from its certificate, on a resumption the relay opens to a gateway: the gateway
    /// resumes a circuit only for the identity it was made with.
    public static let deviceIDHeader = "ils-device-id"
    /// Header of the gateway's answer on the control stream: the service it hosts.
    public static let serviceHeader = "ils-service"
    /// Path of the control stream the controller opens first on a gateway connection.
    public static let controlPath = "/ils/v1/host"

    /// Per-stream flow-control window: large enough for bulk transfers, small enough that a stalled circuit holds
    /// little memory. Each side buffers at most about this much per circuit.
    public static let streamWindow = 1 << 20
    /// Connection-level flow-control window: what all circuits of one connection may have in flight together.
    public static let connectionWindow = 16 << 20
    /// Largest DATA frame each side accepts (SETTINGS_MAX_FRAME_SIZE): one whole end-to-end record.
    public static let maximumFrameSize = 128 * 1024
}
