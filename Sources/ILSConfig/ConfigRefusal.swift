public import ILSCore

/// Why a config file was refused. Each kind has its own exit status (90-94), so a script or a unit manager can tell
/// a missing file from a typo without reading the sentence.
extension ILSError.Code {
    /// `--config` names a file that does not exist.
    public static let configMissing = ILSError.Code("config_missing", exitCode: 90)
    /// The file exists but cannot be read (permissions, a directory, not UTF-8).
    public static let configUnreadable = ILSError.Code("config_unreadable", exitCode: 91)
    /// The file is not YAML, or not a mapping of `key: value` lines.
    public static let configSyntax = ILSError.Code("config_syntax", exitCode: 92)
    /// A key the command does not know, or the same key twice.
    public static let configUnknownKey = ILSError.Code("config_unknown_key", exitCode: 93)
    /// A known key whose value has the wrong type (a list where a path goes, text where a number goes).
    public static let configWrongType = ILSError.Code("config_wrong_type", exitCode: 94)
}
