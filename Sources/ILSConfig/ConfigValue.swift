/// A value read from a config file, already checked against its key's kind.
public enum ConfigValue: Hashable, Sendable {
    case string(String)
    case integer(Int)
    case boolean(Bool)
}
