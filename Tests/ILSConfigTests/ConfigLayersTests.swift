import ILSConfig
import ILSCore
import Testing

@Suite("Where a setting comes from")
struct ConfigLayersTests {
    private func layers(file: [String: ConfigValue]?, environment: [String: String]) -> ConfigLayers {
        ConfigLayers(
            file: file.map { ConfigFile(path: "gateway.yaml", values: $0) },
            environment: { environment[$0] }
        )
    }

    @Test("a flag wins over the environment, the file and the default")
    func flagWins() {
        let layers = layers(
            file: ["backend": .string("http://file:1")],
            environment: ["BACKEND_URL": "http://env:2"]
        )
        #expect(layers.string(.backend, flag: "http://flag:3") == "http://flag:3")
    }

    @Test("the environment wins over the file")
    func environmentBeatsFile() {
        let layers = layers(
            file: ["backend": .string("http://file:1")],
            environment: ["BACKEND_URL": "http://env:2"]
        )
        #expect(layers.string(.backend, flag: nil) == "http://env:2")
    }

    @Test("the file wins over the default, and an absent key leaves the default to the caller")
    func fileBeatsDefault() {
        let layers = layers(file: ["backend": .string("http://file:1")], environment: [:])
        #expect(layers.string(.backend, flag: nil) == "http://file:1")
        #expect(layers.string(.service, flag: nil) == nil)
    }

    @Test("a key without an environment variable goes flag > file")
    func keyWithoutEnvironment() {
        let layers = layers(
            file: ["backend-header-timeout": .string("120s"), "backend-max-connections": .integer(8)],
            environment: ["BACKEND_HEADER_TIMEOUT": "1s"]
        )
        #expect(layers.string(.backendHeaderTimeout, flag: nil) == "120s")
        #expect(layers.string(.backendHeaderTimeout, flag: "9s") == "9s")
        #expect(layers.integer(.backendMaxConnections, flag: nil) == 8)
        #expect(layers.integer(.backendMaxConnections, flag: 3) == 3)
    }

    @Test("a switch follows --name or --no-name when given, else the file, else it is off")
    func switches() {
        let on = layers(file: ["plain-http": .boolean(true)], environment: [:])
        let off = layers(file: ["plain-http": .boolean(false)], environment: [:])
        let none = layers(file: nil, environment: [:])
        #expect(on.boolean(.plainHTTP, flag: nil))
        #expect(!on.boolean(.plainHTTP, flag: false))
        #expect(!off.boolean(.plainHTTP, flag: nil))
        #expect(off.boolean(.plainHTTP, flag: true))
        #expect(!none.boolean(.plainHTTP, flag: nil))
    }

    @Test("a value that must parse is refused with the file's name when the file holds a bad one")
    func parsedRefusal() throws {
        let layers = layers(file: ["mode": .string("tcp")], environment: [:])
        #expect(throws: ILSError(.configWrongType, "gateway.yaml: 'tcp' is not a valid value for 'mode'")) {
            _ = try layers.parsed(.mode, flag: nil) { ["ziti", "http"].contains($0) ? $0 : nil }
        }
        let fromEnvironment = self.layers(file: ["mode": .string("tcp")], environment: ["NETWORKING_MODE": "http"])
        #expect(try fromEnvironment.parsed(.mode, flag: nil) { $0 } == "http")
        #expect(try fromEnvironment.parsed(.mode, flag: "ziti") { $0 } == "ziti")
    }
}
