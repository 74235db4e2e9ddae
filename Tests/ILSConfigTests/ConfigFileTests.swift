import ILSConfig
import ILSCore
import Testing

@Suite("Config files")
struct ConfigFileTests {
    @Test("a file with every kind of value parses")
    func parses() throws {
        let file = try ConfigFile.parse(
            """
            # the gateway next to the backend
            mode: http
            backend: http://127.0.0.1:8000
            listen: 0.0.0.0:8443
            plain-http: false
            backend-max-connections: 256
            backend-header-timeout: 300s
            """,
            path: "serve.yaml",
            schema: .serve
        )
        #expect(file.values["mode"] == .string("http"))
        #expect(file.values["listen"] == .string("0.0.0.0:8443"))
        #expect(file.values["plain-http"] == .boolean(false))
        #expect(file.values["backend-max-connections"] == .integer(256))
        #expect(file.values["backend-header-timeout"] == .string("300s"))
    }

    @Test("an empty or all-comment file sets nothing")
    func empty() throws {
        #expect(try ConfigFile.parse("# nothing yet\n", path: "t.yaml", schema: .tunnel).values.isEmpty)
        #expect(try ConfigFile.parse("", path: "t.yaml", schema: .tunnel).values.isEmpty)
    }

    @Test("an unknown key is refused by name, with the file and line")
    func unknownKey() {
        let error = #expect(throws: ILSError.self) {
            try ConfigFile.parse("listen: 127.0.0.1:8080\nbackned: http://x\n", path: "g.yaml", schema: .serve)
        }
        #expect(error?.code == .configUnknownKey)
        #expect(error?.reason.contains("g.yaml line 2: unknown key 'backned' for serve") == true)
    }

    @Test("a key of another role is unknown to this one")
    func otherRolesKey() {
        let error = #expect(throws: ILSError.self) {
            try ConfigFile.parse("backend: http://127.0.0.1:8000\n", path: "t.yaml", schema: .tunnel)
        }
        #expect(error?.code == .configUnknownKey)
        #expect(error?.reason.contains("'backend'") == true)
    }

    @Test("a key given twice is refused")
    func duplicate() {
        let error = #expect(throws: ILSError.self) {
            try ConfigFile.parse("listen: a:1\nlisten: b:2\n", path: "t.yaml", schema: .tunnel)
        }
        #expect(error?.code == .configUnknownKey)
        #expect(error?.reason.contains("'listen'") == true)
    }

    @Test("a value of the wrong type is refused naming the key")
    func wrongType() {
        let cases: [(String, String)] = [
            ("backend-max-connections: lots\n", "'backend-max-connections' must be a whole number"),
            ("plain-http: maybe\n", "'plain-http' must be true or false"),
            ("backend: [a, b]\n", "'backend' must be a single value, not a list"),
            ("identity:\n", "'identity' must be a single value, not empty"),
        ]
        for (text, expected) in cases {
            let error = #expect(throws: ILSError.self) {
                try ConfigFile.parse(text, path: "s.yaml", schema: .serve)
            }
            #expect(error?.code == .configWrongType)
            #expect(error?.reason.contains(expected) == true, "\(error?.reason ?? "")")
        }
    }

    @Test("text that is not a mapping, or not YAML, is a syntax refusal")
    func syntax() {
        for text in ["- listen\n- service\n", "listen: [unclosed\n", "just words\n"] {
            let error = #expect(throws: ILSError.self) {
                try ConfigFile.parse(text, path: "s.yaml", schema: .tunnel)
            }
            #expect(error?.code == .configSyntax)
            #expect(error?.reason.hasPrefix("s.yaml") == true)
        }
    }

    @Test("a missing file and an unreadable file have their own codes")
    func missingAndUnreadable() {
        let missing = #expect(throws: ILSError.self) {
            try ConfigFile.load(path: "/nonexistent/ils/serve.yaml", schema: .serve)
        }
        #expect(missing?.code == .configMissing)
        #expect(missing?.reason == "config file /nonexistent/ils/serve.yaml does not exist")
        // A directory opens but cannot be read as a file, even by root.
        let path = "/tmp"
        let unreadable = #expect(throws: ILSError.self) {
            try ConfigFile.load(path: path, schema: .serve)
        }
        #expect(unreadable?.code == .configUnreadable)
        #expect(unreadable?.code.exitCode != missing?.code.exitCode)
    }

    @Test("refusal kinds have distinct exit statuses that no other error uses")
    func exitCodes() {
        let config: [ILSError.Code] = [
            .configMissing, .configUnreadable, .configSyntax, .configUnknownKey, .configWrongType,
        ]
        let others: [ILSError.Code] = [
            .invalidArgument, .invalidInput, .cannotWrite, .unavailable, .notFound, .permissionDenied, .conflict,
            .internalError,
        ]
        let statuses = Set(config.map(\.exitCode))
        #expect(statuses.count == config.count)
        #expect(statuses.isDisjoint(with: others.map(\.exitCode)))
    }
}
