public import ILSCore
import Yams

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif

/// A role's config file: a flat YAML mapping whose keys are the command's long flag names.
///
/// The file is checked whole before anything starts: every key must be in the command's schema (a typo such as
/// `backned:` would otherwise leave the default in force without a word), no key may appear twice, and every value
/// must have its key's kind. A refusal names the file, the line and the key in one sentence.
public struct ConfigFile: Sendable {
    public let path: String
    public let values: [String: ConfigValue]

    public init(path: String, values: [String: ConfigValue]) {
        self.path = path
        self.values = values
    }

    /// Reads and checks the file at `path`.
    public static func load(path: String, schema: ConfigSchema) throws(ILSError) -> ConfigFile {
        let text = try readText(path: path)
        return try parse(text, path: path, schema: schema)
    }

    /// Checks YAML `text` against `schema`; `path` only names the file in refusals.
    public static func parse(_ text: String, path: String, schema: ConfigSchema) throws(ILSError) -> ConfigFile {
        let root: Node?
        do {
            root = try Yams.compose(yaml: text)
        } catch YamlError.duplicatedKeysInMapping(let duplicates, let context) {
            let names = duplicates.joined(separator: "', '")
            throw ILSError(.configUnknownKey, "\(path) line \(context.mark.line): key '\(names)' is given twice")
        } catch let error as YamlError {
            throw ILSError(.configSyntax, "\(path) is not valid YAML: \(describe(error))")
        } catch {
            throw ILSError(.configSyntax, "\(path) is not valid YAML")
        }
        guard let root else { return ConfigFile(path: path, values: [:]) }
        guard case .mapping(let mapping) = root else {
            throw ILSError(.configSyntax, "\(path) must be a list of 'key: value' lines, one setting per line")
        }
        var values: [String: ConfigValue] = [:]
        for (keyNode, valueNode) in mapping {
            let line = keyNode.mark.map { " line \($0.line)" } ?? ""
            guard case .scalar(let keyScalar) = keyNode else {
                throw ILSError(.configSyntax, "\(path)\(line): a key must be a plain name such as 'listen'")
            }
            let name = keyScalar.string
            guard let key = schema.key(named: name) else {
                throw ILSError(
                    .configUnknownKey,
                    "\(path)\(line): unknown key '\(name)' for \(schema.command) (see ils-gateway \(schema.command) --help)"
                )
            }
            guard values[name] == nil else {
                throw ILSError(.configUnknownKey, "\(path)\(line): key '\(name)' is given twice")
            }
            values[name] = try value(valueNode, for: key, in: "\(path)\(line)")
        }
        return ConfigFile(path: path, values: values)
    }

    private static func value(_ node: Node, for key: ConfigKey, in place: String) throws(ILSError) -> ConfigValue {
        guard case .scalar(let scalar) = node, node.null == nil else {
            throw ILSError(
                .configWrongType,
                "\(place): '\(key.name)' must be \(expected(key.kind)), not \(shape(node))"
            )
        }
        switch key.kind {
        case .string:
            return .string(scalar.string)
        case .integer:
            guard let number = node.int else {
                throw ILSError(
                    .configWrongType,
                    "\(place): '\(key.name)' must be \(expected(key.kind)), not '\(scalar.string)'"
                )
            }
            return .integer(number)
        case .boolean:
            guard let flag = node.bool else {
                throw ILSError(
                    .configWrongType,
                    "\(place): '\(key.name)' must be \(expected(key.kind)), not '\(scalar.string)'"
                )
            }
            return .boolean(flag)
        }
    }

    private static func expected(_ kind: ConfigKey.Kind) -> String {
        switch kind {
        case .string: "a single value"
        case .integer: "a whole number"
        case .boolean: "true or false"
        }
    }

    private static func shape(_ node: Node) -> String {
        switch node {
        case .mapping: "a mapping"
        case .sequence: "a list"
        case .alias: "an alias"
        case .scalar: "empty"
        }
    }

    private static func describe(_ error: YamlError) -> String {
        switch error {
        case .scanner(_, let problem, let mark, _), .parser(_, let problem, let mark, _),
            .composer(_, let problem, let mark, _):
            "\(problem) at line \(mark.line)"
        case .reader(let problem, _, _, _):
            problem
        default:
            "it cannot be parsed"
        }
    }

    /// Reads the whole file, telling a missing file apart from one that exists but cannot be read.
    private static func readText(path: String) throws(ILSError) -> String {
        let descriptor = open(path, O_RDONLY | O_CLOEXEC)
        guard descriptor >= 0 else {
            let reason = errno
            if reason == ENOENT || reason == ENOTDIR {
                throw ILSError(.configMissing, "config file \(path) does not exist")
            }
            throw ILSError(
                .configUnreadable,
                "config file \(path) cannot be read: \(String(cString: strerror(reason)))"
            )
        }
        defer { close(descriptor) }
        var bytes: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 16384)
        while true {
            let count = buffer.withUnsafeMutableBytes { read(descriptor, $0.baseAddress, $0.count) }
            if count == 0 { break }
            if count < 0 {
                let reason = errno
                if reason == EINTR { continue }
                throw ILSError(
                    .configUnreadable,
                    "config file \(path) cannot be read: \(String(cString: strerror(reason)))"
                )
            }
            bytes.append(contentsOf: buffer[0..<count])
            if bytes.count > 1 << 20 {
                throw ILSError(
                    .configUnreadable,
                    "config file \(path) is larger than 1 MiB; it cannot be a config file"
                )
            }
        }
        let text = String(decoding: bytes, as: UTF8.self)
        // Decoding replaces invalid sequences, so a round trip that differs means the file is not UTF-8.
        guard text.utf8.elementsEqual(bytes) else {
            throw ILSError(.configUnreadable, "config file \(path) is not UTF-8 text")
        }
        return text
    }
}
