import ILSConfig
import ILSCore
import Testing

/// The commented examples under deploy/config/ are what people copy; each must parse against its command's schema.
@Suite("Shipped config examples")
struct ShippedExamplesTests {
    private static let root: String = {
        var parts = #filePath.split(separator: "/", omittingEmptySubsequences: false)
        parts.removeLast(3)
        return parts.joined(separator: "/")
    }()

    @Test(
        "each example under deploy/config parses",
        arguments: [
            ("controller.yaml", ConfigSchema.controllerRun),
            ("gateway.yaml", ConfigSchema.serve),
            ("gateway-http.yaml", ConfigSchema.serve),
            ("tunnel.yaml", ConfigSchema.tunnel),
        ]
    )
    func parses(name: String, schema: ConfigSchema) throws {
        let file = try ConfigFile.load(path: "\(Self.root)/deploy/config/\(name)", schema: schema)
        #expect(!file.values.isEmpty)
    }
}
