import CQREncode
public import ILSCore

/// A QR code's modules, encoded by Debian's libqrencode (the encoding is never done here: this only draws it).
public struct QRMatrix: Sendable, Equatable {
    /// Error correction: `low` (7 %) keeps a terminal code small; `medium` (15 %) suits an image that may be printed or
    /// photographed off a screen.
    public enum Level: Sendable {
        case low
        case medium
    }

    /// Modules per side, without the quiet zone.
    public let width: Int
    private let modules: [Bool]

    /// Whether the module at column `x`, row `y` is dark; outside the symbol (the quiet zone) it is light.
    public subscript(x x: Int, y y: Int) -> Bool {
        guard x >= 0, y >= 0, x < width, y < width else { return false }
        return modules[y * width + x]
    }

    /// The code of `text`, as bytes (8-bit mode). Text beyond a QR code's capacity is refused.
    public static func encode(_ text: String, level: Level) throws(ILSError) -> QRMatrix {
        guard let code = QRcode_encodeString8bit(text, 0, level == .low ? QR_ECLEVEL_L : QR_ECLEVEL_M) else {
            throw ILSError(.invalidInput, "\(text.utf8.count) bytes do not fit in a QR code")
        }
        defer { QRcode_free(code) }
        let width = Int(code.pointee.width)
        guard width > 0, let data = code.pointee.data else {
            throw ILSError(.internalError, "libqrencode returned an empty symbol")
        }
        // libqrencode's bytes: bit 0 is the module's colour (1 = dark); the other bits say what the module is for.
        let modules = (0..<(width * width)).map { data[$0] & 1 == 1 }
        return QRMatrix(width: width, modules: modules)
    }

    /// The code for a terminal with a dark background: two modules per character (`▀`, `▄`, `█`, space), light
    /// modules drawn, a quiet zone of `quietZone` modules around. About `width + 8` columns wide.
    public func terminalText(quietZone: Int = 4) -> String {
        let range = -quietZone..<(width + quietZone)
        var lines: [String] = []
        for top in stride(from: range.lowerBound, to: range.upperBound, by: 2) {
            var line = ""
            for x in range {
                let upperLight = !self[x: x, y: top]
                let lowerLight = top + 1 < range.upperBound ? !self[x: x, y: top + 1] : false
                switch (upperLight, lowerLight) {
                case (true, true): line += "█"
                case (true, false): line += "▀"
                case (false, true): line += "▄"
                case (false, false): line += " "
                }
            }
            lines.append(line)
        }
        return lines.joined(separator: "\n") + "\n"
    }

    /// The code as a PNG: 8-bit greyscale, `scale` pixels per module, dark on white, a quiet zone of `quietZone`
    /// modules. See `PNGWriter` for why the container is written here.
    public func png(scale: Int = 8, quietZone: Int = 4) -> [UInt8] {
        let side = (width + 2 * quietZone) * scale
        var rows: [[UInt8]] = []
        rows.reserveCapacity(side)
        for py in 0..<side {
            let y = py / scale - quietZone
            var row = [UInt8](repeating: 255, count: side)
            for px in 0..<side where self[x: px / scale - quietZone, y: y] { row[px] = 0 }
            rows.append(row)
        }
        return PNGWriter.greyscale(width: side, height: side, rows: rows)
    }
}
