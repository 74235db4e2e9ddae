import ArgumentParser
import ILSConfig
import ILSCore
import ILSFabric
import NIOCore

/// How long circuits whose network path is lost are held for resumption, and what they may keep meanwhile
/// (docs/operations.md, "Resumption").
struct ResumeOptions: ParsableArguments {
    @Option(
        help: """
            How long a circuit whose network path is lost (a device's network change, a dead controller, a dropped \
            link) is held for the device to resume it; the backend request goes on meanwhile. 0 ends the circuit \
            with its path. Default: 60s.
            """
    )
    var resumeGrace: String?

    @Option(
        help: """
            Overlay gateway: what one circuit keeps of its answer until the device acknowledges it (B, KiB or MiB); \
            at this bound it stops reading its backend. It is also the circuit's window: a larger one carries a bulk \
            answer faster. Default: 3MiB; from 640KiB (a device owes an acknowledgement after 256KiB) to \
            4MiB.
            """
    )
    var resumeBuffer: String?

    @Option(
        help: """
            Overlay gateway: what the circuits of one device keep together beyond 640KiB each (KiB, MiB or GiB); a \
            circuit past 640KiB stops reading its backend while its device is at this bound. Default: 32MiB.
            """
    )
    var resumePerIdentity: String?

    @Option(
        help: """
            Overlay gateway: what all held circuits (their path lost) keep together (KiB, MiB or GiB), counting \
            what each kept when it was held: a circuit that would go over it is not held (it ends with its path); \
            held circuits stop reading their backends before they reach it. Default: 256MiB.
            """
    )
    var resumeTotal: String?

    @Option(
        help: """
            Overlay gateway: the most circuits of one device held at once; a further circuit whose path is lost \
            is not held (it ends with its path, and its backend request with it). Default: 64.
            """
    )
    var resumeHeldPerIdentity: Int?

    func resolve(_ layers: ConfigLayers) throws(ILSError) -> CircuitRetention {
        let grace = try Self.grace(layers, flag: resumeGrace)
        let buffer = try Self.bytes(layers.string(.resumeBuffer, flag: resumeBuffer), name: "--resume-buffer")
        let total = try Self.bytes(layers.string(.resumeTotal, flag: resumeTotal), name: "--resume-total")
        let perCircuit = buffer ?? CircuitRetention.defaultPerCircuit
        guard perCircuit >= CircuitRetention.minimumPerCircuit, perCircuit <= CircuitRetention.maximumPerCircuit else {
            throw ILSError(
                .invalidArgument,
                "--resume-buffer must be between 640KiB and 4MiB: a device owes an acknowledgement after 256 KiB, and a "
                    + "smaller buffer could wait a second for each one"
            )
        }
        let limit = total ?? CircuitRetention.defaultTotal
        guard limit >= perCircuit else {
            throw ILSError(.invalidArgument, "--resume-total must be at least --resume-buffer")
        }
        let perIdentity =
            try Self.bytes(layers.string(.resumePerIdentity, flag: resumePerIdentity), name: "--resume-per-identity")
            ?? CircuitRetention.defaultPerIdentity
        guard perIdentity >= CircuitRetention.minimumPerCircuit else {
            throw ILSError(
                .invalidArgument,
                "--resume-per-identity must be at least 640KiB: each circuit keeps up to 640KiB whatever its device's "
                    + "bound"
            )
        }
        let heldPerIdentity =
            layers.integer(.resumeHeldPerIdentity, flag: resumeHeldPerIdentity)
            ?? CircuitRetention.defaultHeldPerIdentity
        guard heldPerIdentity >= 1 else {
            throw ILSError(
                .invalidArgument,
                "--resume-held-per-identity must be at least 1 (--resume-grace 0 holds no circuit at all)"
            )
        }
        return CircuitRetention(
            grace: grace,
            perCircuit: perCircuit,
            budget: RetentionBudget(limit: limit, perIdentity: perIdentity, heldPerIdentity: heldPerIdentity)
        )
    }

    /// `--resume-grace` (or its config key), 60 s when unset.
    static func grace(_ layers: ConfigLayers, flag: String?) throws(ILSError) -> TimeAmount {
        let span = try TimeSpan(parsing: layers.string(.resumeGrace, flag: flag) ?? "60s")
        guard span.nanoseconds <= 3_600_000_000_000 else {
            throw ILSError(.invalidArgument, "--resume-grace must be at most 1h")
        }
        return .nanoseconds(span.nanoseconds)
    }

    /// A size: digits, then nothing (bytes), `KiB`, `MiB` or `GiB`.
    static func bytes(_ text: String?, name: String) throws(ILSError) -> Int? {
        guard let text else { return nil }
        let units: [(String, Int)] = [("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10), ("B", 1), ("", 1)]
        for (suffix, scale) in units where text.hasSuffix(suffix) {
            let digits = text.dropLast(suffix.count)
            guard !digits.isEmpty, digits.allSatisfy(\.isASCII), let value = Int(digits), value >= 0,
                value <= Int.max / scale
            else { break }
            return value * scale
        }
        throw ILSError(.invalidArgument, "\(name) must be a size such as 512KiB or 1MiB, not '\(text)'")
    }
}
