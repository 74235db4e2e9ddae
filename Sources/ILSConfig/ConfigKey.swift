/// One setting a role's config file may hold. Its name is the long flag's name without the dashes, so a line in the
/// file reads like the flag it stands for (`backend: http://127.0.0.1:8000` for `--backend`).
public struct ConfigKey: Hashable, Sendable {
    /// What a value must look like in the file.
    public enum Kind: String, Sendable {
        /// Any scalar: a path, a URL, `HOST:PORT`, a duration such as `30s`, a name.
        case string
        /// A whole number.
        case integer
        /// `true` or `false`.
        case boolean
    }

    public let name: String
    public let kind: Kind
    /// The environment variable read when the flag is absent, if the setting has one.
    public let environment: String?

    public init(_ name: String, _ kind: Kind = .string, environment: String? = nil) {
        self.name = name
        self.kind = kind
        self.environment = environment
    }

    /// How the setting is given on the command line.
    public var flag: String { "--\(name)" }
}
