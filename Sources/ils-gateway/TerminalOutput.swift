import ILSCore

/// The one way the CLI prints a line of text for a person: every string in it may come from the controller or a
/// peer (names, services, audit rows, refusal sentences), so control characters are shown as escapes and can never
/// move the cursor, rewrite a line or change colours on the admin's terminal (`ControlCharacters`). JSON output goes
/// through `printJSON` instead, whose encoder escapes them the JSON way.
func say(_ line: String) {
    print(ControlCharacters.escaped(line))
}

/// `say` for stderr: the next-step hints that quote a name the controller returned.
func sayToStandardError(_ line: String) {
    writeToStandardError(ControlCharacters.escaped(line) + "\n")
}

/// One table cell: the text made safe first, then padded to `width` (so an escape widens its cell, never the
/// columns after it by surprise), with one space after text that fills it.
func cell(_ text: String, _ width: Int) -> String {
    let safe = ControlCharacters.escaped(text)
    return safe.count >= width ? safe + " " : safe + String(repeating: " ", count: width - safe.count)
}
