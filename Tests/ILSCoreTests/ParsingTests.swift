import ILSCore
import Testing

@Suite("Command-line values")
struct ParsingTests {
    @Test(
        "durations read like 30s, 15m, 24h, 7d, 250ms",
        arguments: [
            ("30s", Int64(30_000_000_000)), ("15m", 900_000_000_000), ("24h", 86_400_000_000_000),
            ("7d", 604_800_000_000_000), ("250ms", 250_000_000), ("0", 0),
        ]
    )
    func durations(text: String, nanoseconds: Int64) throws {
        #expect(try TimeSpan(parsing: text).nanoseconds == nanoseconds)
    }

    @Test(
        "a duration without a unit, negative, or absurd is refused",
        arguments: [
            "30", "-5s", "5 s", "1y", "", "s",
            "99999999999999d",
        ]
    )
    func badDurations(text: String) {
        #expect(throws: ILSError.self) { try TimeSpan(parsing: text) }
    }

    @Test("durations print in their shortest exact unit")
    func durationDescription() throws {
        #expect(TimeSpan.seconds(120).description == "2m")
        #expect(TimeSpan.seconds(90).description == "90s")
        #expect(TimeSpan.milliseconds(1500).description == "1500ms")
    }

    @Test("HOST:PORT, including bracketed IPv6")
    func hostPort() throws {
        #expect(try HostPort(parsing: "127.0.0.1:8443") == HostPort(host: "127.0.0.1", port: 8443))
        #expect(try HostPort(parsing: "[::1]:0") == HostPort(host: "::1", port: 0))
        #expect(try HostPort(parsing: "localhost:80").description == "localhost:80")
        for bad in ["127.0.0.1", ":80", "host:99999", "::1:80", "host:", "host:8a"] {
            #expect(throws: ILSError.self) { try HostPort(parsing: bad) }
        }
    }

    @Test("backend URLs are http://HOST[:PORT] and nothing else")
    func backendURL() throws {
        #expect(try BackendURL(parsing: "http://127.0.0.1:8000") == BackendURL(host: "127.0.0.1", port: 8000))
        #expect(try BackendURL(parsing: "http://localhost/") == BackendURL(host: "localhost", port: 80))
        #expect(try BackendURL(parsing: "http://[::1]:9090").port == 9090)
        for bad in ["https://x:1", "127.0.0.1:8000", "http://x:1/api", "http://u:p@x:1", "http://x:1?q"] {
            #expect(throws: ILSError.self) { try BackendURL(parsing: bad) }
        }
    }

    @Test("every error code has a distinct exit status")
    func exitCodes() {
        let codes: [ILSError.Code] =
            [
                .invalidArgument, .invalidInput, .cannotWrite, .unavailable, .internalError, .notFound,
                .permissionDenied,
                .conflict,
            ] + EnrollmentRefusal.allCases.map { $0.error.code }
        #expect(Set(codes.map(\.exitCode)).count == codes.count)
    }

    @Test("loopback means this machine only")
    func loopback() {
        for host in ["127.0.0.1", "127.1.2.3", "::1", "localhost"] { #expect(HostPort(host: host, port: 1).isLoopback) }
        for host in ["0.0.0.0", "192.168.1.2", "::", "example.com"] {
            #expect(!HostPort(host: host, port: 1).isLoopback)
        }
    }
}
