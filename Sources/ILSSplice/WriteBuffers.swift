public import NIOCore

/// How many written bytes a channel on a circuit's path may hold before it reports itself unwritable (NIO's write
/// buffer watermarks), which is what holds reads on the other side of the splice.
///
/// NIO's defaults (64 KiB for a socket, about 8 KiB for an HTTP/2 stream) are below one end-to-end record (64 KiB):
/// a single record turned a stream unwritable, and a socket nearly so, so a bulk transfer stopped and restarted its
/// reads at every record. With room for a few records, a 1 GiB download through the overlay costs the gateway 7–9 %
/// less CPU and runs about 4 % faster (alternating benchmark runs, docs/benchmarks.md). Memory is bounded as before,
/// by a few records per busy channel; idle channels hold nothing.
public enum WriteBuffers {
    /// An overlay connection (TLS to the controller, carrying every circuit of a device or gateway).
    public static let overlayConnection = WriteBufferWaterMark(low: 256 * 1024, high: 512 * 1024)
    /// One circuit's HTTP/2 stream.
    public static let stream = WriteBufferWaterMark(low: 128 * 1024, high: 256 * 1024)
    /// A plain TCP connection at either end of a circuit: the gateway's to its backend, a tunnel's from a local client.
    public static let localConnection = WriteBufferWaterMark(low: 128 * 1024, high: 256 * 1024)
}
