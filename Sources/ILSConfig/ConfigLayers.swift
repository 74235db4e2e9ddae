public import ILSCore

/// Where each setting comes from: the flag if given, else the environment variable, else the config file, else the
/// command's default. Commands ask this for every value, so the order is decided in one place.
public struct ConfigLayers: Sendable {
    public let file: ConfigFile?
    private let environment: @Sendable (String) -> String?

    /// `environment` returns a variable's value, or nil when it is unset or empty.
    public init(file: ConfigFile?, environment: @escaping @Sendable (String) -> String?) {
        self.file = file
        self.environment = environment
    }

    /// A string setting: `flag` > `key.environment` > file > nil (the caller supplies the default).
    public func string(_ key: ConfigKey, flag: String?) -> String? {
        if let flag { return flag }
        if let name = key.environment, let value = environment(name) { return value }
        if case .string(let value)? = file?.values[key.name] { return value }
        return nil
    }

    /// A list setting: the repeated flag if given at least once, else the variable's or the file's comma-separated
    /// text (spaces around each item dropped, empty items skipped), else empty.
    public func list(_ key: ConfigKey, flag: [String]) -> [String] {
        if !flag.isEmpty { return flag }
        guard let text = string(key, flag: nil) else { return [] }
        return text.split(separator: ",").map { item in
            String(item.drop { $0 == " " }.reversed().drop { $0 == " " }.reversed())
        }.filter { !$0.isEmpty }
    }

    /// An integer setting: flag > file > nil.
    public func integer(_ key: ConfigKey, flag: Int?) -> Int? {
        if let flag { return flag }
        if case .integer(let value)? = file?.values[key.name] { return value }
        return nil
    }

    /// A switch: `--name` or `--no-name` on the command line decides; otherwise the file; otherwise off.
    public func boolean(_ key: ConfigKey, flag: Bool?) -> Bool {
        if let flag { return flag }
        if case .boolean(let value)? = file?.values[key.name] { return value }
        return false
    }

    /// A setting whose text must parse (a level, a mode): refuses a bad value with the place it came from.
    public func parsed<Value>(
        _ key: ConfigKey,
        flag: Value?,
        parse: (String) -> Value?
    ) throws(ILSError) -> Value? {
        if let flag { return flag }
        if let name = key.environment, let text = environment(name) {
            guard let value = parse(text) else {
                throw ILSError(.invalidArgument, "\(name)='\(text)' is not a valid value for \(key.flag)")
            }
            return value
        }
        if case .string(let text)? = file?.values[key.name], let file {
            guard let value = parse(text) else {
                throw ILSError(.configWrongType, "\(file.path): '\(text)' is not a valid value for '\(key.name)'")
            }
            return value
        }
        return nil
    }
}
