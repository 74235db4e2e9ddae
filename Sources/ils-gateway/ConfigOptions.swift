import ArgumentParser
import ILSConfig
import ILSCore

/// `--config FILE`, shared by the long-running commands (`controller run`, `serve`, `tunnel`).
struct ConfigOptions: ParsableArguments {
    @Option(
        help: ArgumentHelp(
            "YAML file of settings named like the long flags (examples in deploy/config/); flags and environment "
                + "variables win over it. Env: ILS_CONFIG.",
            valueName: "file"
        )
    )
    var config: String?

    /// Loads and checks the file, if one is named, before anything starts; a bad file stops the command here.
    func layers(_ schema: ConfigSchema) throws(ILSError) -> ConfigLayers {
        let environment = ProcessEnvironment()
        var file: ConfigFile?
        if let path = config ?? environment["ILS_CONFIG"] {
            file = try ConfigFile.load(path: path, schema: schema)
        }
        return ConfigLayers(file: file, environment: { environment[$0] })
    }
}
