import ILSCore
import Logging
import Mustache
import Testing

@testable import ILSConsole

struct ConsoleConfigurationTests {
    @Test func beyondLoopbackNeedsTLS() throws {
        for host in ["0.0.0.0", "192.168.1.20", "::", "example.org"] {
            let error = #expect(throws: ILSError.self) { try ConsoleConfiguration(host: host).validate() }
            #expect(error?.code == .invalidArgument)
            #expect(error?.reason.contains("only with TLS") == true)
            try ConsoleConfiguration(
                host: host,
                tlsCertificatePath: "c.pem",
                tlsKeyPath: "k.pem",
                allowedHosts: ["console.example.org"]
            ).validate()
        }
        for host in ["127.0.0.1", "127.8.9.10", "::1", "localhost", "LOCALHOST"] {
            try ConsoleConfiguration(host: host).validate()
        }
        #expect(!ConsoleConfiguration.isLoopback("127.0.0.1.example.org"))
        #expect(!ConsoleConfiguration.isLoopback("128.0.0.1"))
    }

    @Test func halfATLSPairAndBadHostsAreRefused() {
        #expect(throws: ILSError.self) { try ConsoleConfiguration(tlsCertificatePath: "c.pem").validate() }
        #expect(throws: ILSError.self) { try ConsoleConfiguration(allowedHosts: ["evil\u{1B}[31m"]).validate() }
        #expect(throws: ILSError.self) { try ConsoleConfiguration(allowedHosts: [""]).validate() }
    }

    @Test func capsAndDeadlinesMustBePositive() {
        var configuration = ConsoleConfiguration()
        configuration.maximumConnections = 0
        #expect(
            (#expect(throws: ILSError.self) { try configuration.validate() })?.reason.contains("--max-connections")
                == true
        )
        configuration = ConsoleConfiguration()
        configuration.maximumConnectionsPerSource = 0
        #expect(
            (#expect(throws: ILSError.self) { try configuration.validate() })?.reason
                .contains("--max-connections-per-source") == true
        )
        configuration = ConsoleConfiguration()
        configuration.deadlines.body = .zero
        #expect(
            (#expect(throws: ILSError.self) { try configuration.validate() })?.reason
                .contains("--request-body-timeout") == true
        )
    }

    @Test func theHostCheckAcceptsLoopbackAndAllowedNamesOnly() {
        let guarding = ConsoleGuard(
            sessions: ConsoleSessions(),
            configuration: ConsoleConfiguration(allowedHosts: ["ils-console"]),
            logger: Logger(label: "test")
        )
        for host in ["127.0.0.1:8090", "127.0.0.1", "localhost:1", "[::1]:8090", "ils-console", "ILS-Console:80"] {
            #expect(guarding.isAllowed(host: host), "\(host)")
        }
        for host in [nil, "", "evil.example:8090", "127.0.0.1.evil.example", "[::2]:80", "ils-console.evil.example"] {
            #expect(!guarding.isAllowed(host: host), "\(host ?? "nil")")
        }
    }

    @Test func formFieldsDecode() {
        let fields = FormFields.decode("csrf=a%2Bb&name=ipad+one&empty=&attributes=%23ipad%2C+ops&csrf=last")
        #expect(fields["csrf"] == "last")
        #expect(fields["name"] == "ipad one")
        #expect(fields["empty"] == "")
        #expect(fields["attributes"] == "#ipad, ops")
        #expect(FormFields.decode("%zz=1")["%zz"] == nil)
    }

    /// A template error would otherwise show only when its page is first opened.
    @Test func everyTemplateParsesAndEscapes() throws {
        let library = try ConsoleTemplates.library()
        for (name, _) in ConsoleTemplates.all {
            #expect(library.getTemplate(named: name) != nil, "\(name)")
        }
        let html =
            library.render(
                [
                    "rows": [
                        [
                            "seq": 1, "at": "now", "actor": "<b>admin</b>", "action": "identity.revoke",
                            "target": "x\"onmouseover=\"alert(1)", "detail": "<script>alert(1)</script>",
                        ]
                    ]
                ],
                withTemplate: "audit"
            ) ?? ""
        #expect(html.contains("&lt;script&gt;alert(1)&lt;/script&gt;"))
        #expect(!html.contains("<script>"))
        #expect(!html.contains("<b>admin"))
        #expect(!html.contains("x\"onmouseover"))
    }

    @Test func beyondLoopbackTheListenAddressOrAnAllowedNameIsTheHost() throws {
        let specific = ConsoleConfiguration(host: "192.168.1.5", port: 8443, tlsCertificatePath: "c", tlsKeyPath: "k")
        try specific.validate()
        let guarding = ConsoleGuard(sessions: ConsoleSessions(), configuration: specific, logger: Logger(label: "t"))
        #expect(guarding.isAllowed(host: "192.168.1.5:8443"))
        #expect(!guarding.isAllowed(host: "192.168.1.6:8443"))
        #expect(specific.linkHost == "192.168.1.5")

        // Every address: browsers never send 0.0.0.0, so a name is required, and the link uses it.
        let wildcard = ConsoleConfiguration(host: "0.0.0.0", tlsCertificatePath: "c", tlsKeyPath: "k")
        let error = #expect(throws: ILSError.self) { try wildcard.validate() }
        #expect(error?.reason.contains("--allowed-host") == true)
        var named = wildcard
        named.allowedHosts = ["console.example.org"]
        try named.validate()
        #expect(named.linkHost == "console.example.org")
        let any = ConsoleGuard(sessions: ConsoleSessions(), configuration: named, logger: Logger(label: "t"))
        #expect(!any.isAllowed(host: "0.0.0.0:8090"))
        #expect(any.isAllowed(host: "console.example.org:8090"))
        #expect(ConsoleConfiguration(host: "::1").linkHost == "[::1]")
    }
}
