// swift-tools-version:6.1
import PackageDescription

/// One set of settings for every target: Swift 6 language mode (strict concurrency) plus the upcoming
/// features the style guide asks for.
let swiftSettings: [SwiftSetting] = [
    .swiftLanguageMode(.v6),
    .enableUpcomingFeature("ExistentialAny"),
    .enableUpcomingFeature("InternalImportsByDefault"),
    .define("ILS_APPLE_CODE_PATH", .when(traits: ["AppleCodePath"])),
]

let package = Package(
    name: "ils-gateway",
    platforms: [.macOS(.v14), .iOS(.v17)],
    products: [
        .executable(name: "ils-gateway", targets: ["ils-gateway"]),
        /// What an app does, from a terminal: enroll, then stream with URLSession through ILSClient.
        .executable(name: "ils-client-example", targets: ["ils-client-example"]),
        .library(name: "ILSProxy", targets: ["ILSProxy"]),
        /// What an app links to enroll and to dial a service through the overlay without a tunnel.
        .library(name: "ILSClient", targets: ["ILSClient"]),
        /// The fuzz targets' entry points, for the libFuzzer harness package in Tests/Fuzz.
        .library(name: "ILSFuzz", targets: ["ILSFuzz"]),
    ],
    traits: [
        .trait(
            name: "AppleCodePath",
            description: """
                Build ILSClient's closure on Linux the way it builds for iOS, macOS and visionOS: end-to-end records \
                sealed through swift-crypto's Swift API (CryptoKit's, on Apple platforms) instead of BoringSSL's \
                in-place AEAD. CI runs the overlay tests, unit and end to end, with it (docs/client-library.md).
                """
        )
    ],
    dependencies: [
        .package(url: "https://github.com/apple/swift-nio.git", from: "2.101.2"),
        .package(url: "https://github.com/apple/swift-nio-ssl.git", from: "2.37.6"),
        .package(url: "https://github.com/apple/swift-nio-extras.git", from: "1.35.2"),
        .package(url: "https://github.com/apple/swift-nio-http2.git", from: "1.46.0"),
        .package(url: "https://github.com/apple/swift-argument-parser.git", from: "1.8.2"),
        .package(url: "https://github.com/apple/swift-log.git", from: "1.16.2"),
        .package(url: "https://github.com/swift-server/swift-service-lifecycle.git", from: "2.13.0"),
        .package(url: "https://github.com/apple/swift-certificates.git", from: "1.21.1"),
        .package(url: "https://github.com/apple/swift-crypto.git", .upToNextMinor(from: "4.5.2")),
        .package(url: "https://github.com/apple/swift-asn1.git", from: "1.7.4"),
        .package(url: "https://github.com/apple/swift-metrics.git", from: "2.13.0"),
        .package(url: "https://github.com/swift-server/swift-prometheus.git", from: "2.4.1"),
        .package(url: "https://github.com/jpsim/Yams.git", from: "6.2.2"),
        .package(url: "https://github.com/vapor/postgres-nio.git", from: "1.33.2"),
        .package(url: "https://github.com/hummingbird-project/hummingbird.git", from: "2.28.1"),
        .package(url: "https://github.com/hummingbird-project/swift-mustache.git", from: "2.1.1"),
        .package(url: "https://github.com/apple/swift-http-types.git", from: "1.8.0"),
    ],
    targets: [
        .systemLibrary(
            name: "CSodium",
            pkgConfig: "libsodium",
            providers: [.apt(["libsodium-dev"])]
        ),
        /// Debian's libqrencode: the QR codes of `admin identity create --qr`. The CLI's only; never in ILSClient's
        /// closure (the app scans codes, it does not draw them).
        .systemLibrary(
            name: "CQREncode",
            pkgConfig: "libqrencode",
            providers: [.apt(["libqrencode-dev"])]
        ),
        /// glibc's <malloc.h> (`mallopt`), which the Glibc module does not import.
        .systemLibrary(name: "CMalloc"),
        .systemLibrary(
            name: "CSQLite",
            pkgConfig: "sqlite3",
            providers: [.apt(["libsqlite3-dev"])]
        ),
        /// Keys, certificates, tokens, the end-to-end handshake (version 3) and records: swift-crypto only, so it
        /// builds for Apple platforms and everything ILSClient reaches stays free of system libraries.
        .target(
            name: "ILSCrypto",
            dependencies: [
                "ILSCore",
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "X509", package: "swift-certificates"),
                .product(name: "SwiftASN1", package: "swift-asn1"),
            ],
            swiftSettings: swiftSettings
        ),
        /// libsodium for what only handshake versions 1 and 2 need (BLAKE2b, secretstream): gateways serve devices
        /// built before version 3. Never in ILSClient's closure (deploy/check-client-closure.sh).
        .target(
            name: "ILSSodium",
            dependencies: [
                "ILSCore",
                "ILSCrypto",
                "CSodium",
                .product(name: "Crypto", package: "swift-crypto"),
            ],
            swiftSettings: swiftSettings
        ),
        .target(
            name: "ILSCore",
            swiftSettings: swiftSettings
        ),
        .target(
            name: "ILSProxy",
            dependencies: [
                "ILSCore",
                "ILSSplice",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: swiftSettings
        ),
        /// Two byte channels spliced with backpressure (`GlueHandler`) and the write buffer sizes that set when it
        /// holds reads (`WriteBuffers`): what HTTP mode's WebSocket upgrade, the overlay and the tunnel share, with
        /// nothing but NIOCore below it, so the proxy core (ILSProxy) imports nothing of the overlay. HTTP mode as a
        /// whole does: ILSGateway holds both modes (docs/architecture.md, "Layers").
        .target(
            name: "ILSSplice",
            dependencies: [
                .product(name: "NIOCore", package: "swift-nio")
            ],
            swiftSettings: swiftSettings
        ),
        /// An enrolled identity's life: its file (read, and written 0600 atomically), noticing a certificate someone
        /// else renewed in it, renewal over mTLS, and the controller API client these go through. Below both the app's
        /// library (ILSClient) and the server-side roles, so no role imports ILSClient. No system library and no
        /// Glibc of its own: it is in ILSClient's closure (deploy/check-client-closure.sh).
        .target(
            name: "ILSIdentity",
            dependencies: [
                "ILSCore",
                "ILSCrypto",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
                .product(name: "NIOConcurrencyHelpers", package: "swift-nio"),
                .product(name: "X509", package: "swift-certificates"),
                .product(name: "SwiftASN1", package: "swift-asn1"),
            ],
            swiftSettings: swiftSettings
        ),
        .target(
            name: "ILSFabric",
            dependencies: [
                "ILSCore",
                "ILSCrypto",
                "ILSSplice",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOHTTP2", package: "swift-nio-http2"),
                .product(name: "NIOHPACK", package: "swift-nio-http2"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
                .product(name: "NIOTLS", package: "swift-nio"),
            ],
            swiftSettings: swiftSettings
        ),
        .target(
            name: "ILSGateway",
            dependencies: [
                .product(name: "Metrics", package: "swift-metrics"),
                "ILSCore",
                "ILSProxy",
                "ILSCrypto",
                "ILSSodium",
                "ILSFabric",
                "ILSIdentity",
                .product(name: "NIOHTTP2", package: "swift-nio-http2"),
                .product(name: "NIOHPACK", package: "swift-nio-http2"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
                .product(name: "NIOExtras", package: "swift-nio-extras"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            ],
            swiftSettings: swiftSettings
        ),
        /// The controller's store: the `ControllerStore` protocol, its records, and the embedded SQLite store (system
        /// libsqlite3, run on NIO's blocking-I/O pool).
        .target(
            name: "ILSStore",
            dependencies: [
                "ILSCore",
                "CSQLite",
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOConcurrencyHelpers", package: "swift-nio"),
            ],
            swiftSettings: swiftSettings
        ),
        /// The PostgreSQL store (postgres-nio) that several controller replicas share, `StoreOpener` (a `--store`
        /// value to a store) and `StoreMigration` (`controller migrate`).
        .target(
            name: "ILSStorePostgres",
            dependencies: [
                "ILSCore",
                "ILSStore",
                .product(name: "PostgresNIO", package: "postgres-nio"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
            ],
            swiftSettings: swiftSettings
        ),
        .target(
            name: "ILSController",
            dependencies: [
                "ILSCore",
                "ILSStore",
                "ILSCrypto",
                "ILSFabric",
                "ILSSplice",
                .product(name: "NIOHTTP2", package: "swift-nio-http2"),
                .product(name: "NIOHPACK", package: "swift-nio-http2"),
                .product(name: "NIOTLS", package: "swift-nio"),
                .product(name: "Metrics", package: "swift-metrics"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
                .product(name: "NIOConcurrencyHelpers", package: "swift-nio"),
                .product(name: "X509", package: "swift-certificates"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            ],
            swiftSettings: swiftSettings
        ),
        /// A device's side of the overlay without Foundation's networking: `OverlayDialer` (the controller
        /// connection, circuits, their resumption) and the link state. Below ILSClient, which wraps it for apps, and
        /// used as it is by the tunnel and the bench, so no server-side target imports ILSClient
        /// (deploy/check-targets.sh). In ILSClient's closure: no system library, no unguarded Glibc.
        .target(
            name: "ILSDial",
            dependencies: [
                "ILSCore",
                "ILSCrypto",
                "ILSFabric",
                "ILSIdentity",
                .product(name: "NIOHTTP2", package: "swift-nio-http2"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
                .product(name: "NIOConcurrencyHelpers", package: "swift-nio"),
            ],
            swiftSettings: swiftSettings
        ),
        .target(
            name: "ILSClient",
            dependencies: [
                "ILSCore",
                "ILSCrypto",
                "ILSFabric",
                "ILSIdentity",
                "ILSDial",
                .product(name: "NIOHTTP2", package: "swift-nio-http2"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
                .product(name: "X509", package: "swift-certificates"),
                .product(name: "SwiftASN1", package: "swift-asn1"),
                .product(name: "NIOConcurrencyHelpers", package: "swift-nio"),
            ],
            swiftSettings: swiftSettings
        ),
        /// Config files for the long-running roles: YAML keys named like the long flags, checked against one schema
        /// per command, and the flag > environment > file > default order.
        .target(
            name: "ILSConfig",
            dependencies: [
                "ILSCore",
                .product(name: "Yams", package: "Yams"),
            ],
            swiftSettings: swiftSettings
        ),
        .target(
            name: "ILSObservability",
            dependencies: [
                "ILSCore",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "NIOConcurrencyHelpers", package: "swift-nio"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "Metrics", package: "swift-metrics"),
                .product(name: "Prometheus", package: "swift-prometheus"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            ],
            swiftSettings: swiftSettings
        ),
        .target(
            name: "ILSTunnel",
            dependencies: [
                .product(name: "Metrics", package: "swift-metrics"),
                "ILSCore",
                "ILSDial",
                "ILSIdentity",
                "ILSFabric",
                "ILSSplice",
                .product(name: "NIOHTTP2", package: "swift-nio-http2"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "NIOConcurrencyHelpers", package: "swift-nio"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            ],
            swiftSettings: swiftSettings
        ),
        .target(
            name: "ILSTesting",
            dependencies: [
                "ILSCore",
                "ILSStore",
                "ILSCrypto",
                "ILSProxy",
                "ILSController",
                "ILSGateway",
                "ILSTunnel",
                "ILSIdentity",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "NIOEmbedded", package: "swift-nio"),
                .product(name: "NIOHTTP2", package: "swift-nio-http2"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
                .product(name: "X509", package: "swift-certificates"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "SwiftASN1", package: "swift-asn1"),
            ],
            swiftSettings: swiftSettings
        ),
        /// One entry per parser that reads network input, driving the real code; Tests/Fuzz links them to libFuzzer
        /// and ILSFuzzTests replays the corpus and past findings through them.
        .target(
            name: "ILSFuzz",
            dependencies: [
                "ILSCore",
                "ILSStore",
                "ILSCrypto",
                "ILSSodium",
                "ILSFabric",
                "ILSProxy",
                "ILSController",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOEmbedded", package: "swift-nio"),
                .product(name: "NIOConcurrencyHelpers", package: "swift-nio"),
                .product(name: "NIOHTTP2", package: "swift-nio-http2"),
                .product(name: "NIOHPACK", package: "swift-nio-http2"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "SwiftASN1", package: "swift-asn1"),
            ],
            swiftSettings: swiftSettings
        ),
        /// What the admin commands and the console share: calls asked of every controller of a cluster at once.
        .target(
            name: "ILSAdmin",
            dependencies: ["ILSCore", "ILSIdentity"],
            swiftSettings: swiftSettings
        ),
        /// `admin console`: the browser console (Hummingbird, swift-mustache). Only the `ils-gateway` executable and
        /// its tests link it: no role, no test helper and never ILSClient (deploy/check-client-closure.sh).
        .target(
            name: "ILSConsole",
            dependencies: [
                "ILSCore",
                "ILSIdentity",
                "ILSFabric",
                "ILSAdmin",
                "ILSQRCode",
                .product(name: "Hummingbird", package: "hummingbird"),
                .product(name: "HummingbirdTLS", package: "hummingbird"),
                .product(name: "HummingbirdCore", package: "hummingbird"),
                .product(name: "Mustache", package: "swift-mustache"),
                .product(name: "HTTPTypes", package: "swift-http-types"),
                .product(name: "NIOHTTPTypes", package: "swift-nio-extras"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
                .product(name: "NIOConcurrencyHelpers", package: "swift-nio"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            ],
            swiftSettings: swiftSettings
        ),
        .testTarget(
            name: "ILSConsoleTests",
            dependencies: [
                "ILSCore",
                "ILSAdmin",
                "ILSConsole",
                .product(name: "Hummingbird", package: "hummingbird"),
                .product(name: "Mustache", package: "swift-mustache"),
                .product(name: "HTTPTypes", package: "swift-http-types"),
                .product(name: "NIOHTTPTypes", package: "swift-nio-extras"),
                .product(name: "NIOEmbedded", package: "swift-nio"),
            ],
            swiftSettings: swiftSettings
        ),
        .executableTarget(
            name: "ils-gateway",
            dependencies: [
                .target(name: "CMalloc", condition: .when(platforms: [.linux])),
                "ILSCore",
                "ILSAdmin",
                "ILSConsole",
                "ILSQRCode",
                "ILSStore",
                "ILSStorePostgres",
                "ILSCrypto",
                "ILSGateway",
                "ILSController",
                "ILSIdentity",
                "ILSTunnel",
                "ILSObservability",
                "ILSConfig",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            ],
            swiftSettings: swiftSettings
        ),
        .executableTarget(
            name: "ils-client-example",
            dependencies: [
                "ILSCore",
                "ILSClient",
                "ILSFabric",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
            ],
            swiftSettings: swiftSettings
        ),
        /// Benchmark peer: a fast NIO backend and the load clients the harness in deploy/bench drives.
        .executableTarget(
            name: "ils-bench",
            dependencies: [
                "ILSSplice",
                "ILSCore",
                "ILSCrypto",
                "ILSSodium",
                "ILSDial",
                "ILSIdentity",
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "NIOConcurrencyHelpers", package: "swift-nio"),
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
            ],
            swiftSettings: swiftSettings
        ),
        /// One contract suite run against every `ControllerStore` (SQLite and a PostgreSQL the tests start), and
        /// `controller migrate`'s copy.
        .testTarget(
            name: "ILSStoreTests",
            dependencies: [
                "ILSCore",
                "ILSCrypto",
                "ILSController",
                "ILSIdentity",
                "ILSStore",
                "ILSStorePostgres",
                "ILSTesting",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "PostgresNIO", package: "postgres-nio"),
            ],
            swiftSettings: swiftSettings
        ),
        /// Enrollment tokens as QR codes: libqrencode's matrix, drawn for a terminal or written as a PNG.
        .target(
            name: "ILSQRCode",
            dependencies: ["ILSCore", "CQREncode"],
            swiftSettings: swiftSettings
        ),
        .testTarget(
            name: "ILSQRCodeTests",
            dependencies: ["ILSCore", "ILSQRCode"],
            swiftSettings: swiftSettings
        ),
        .testTarget(
            name: "ILSCoreTests",
            dependencies: ["ILSCore"],
            swiftSettings: swiftSettings
        ),
        .testTarget(
            name: "ILSConfigTests",
            dependencies: ["ILSCore", "ILSConfig"],
            swiftSettings: swiftSettings
        ),
        .testTarget(
            name: "ILSObservabilityTests",
            dependencies: [
                "ILSCore",
                "ILSObservability",
                "ILSTesting",
                .product(name: "Metrics", package: "swift-metrics"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "NIOCore", package: "swift-nio"),
            ],
            swiftSettings: swiftSettings
        ),
        .testTarget(
            name: "ILSGatewayTests",
            dependencies: [
                "ILSCore",
                "ILSCrypto",
                "ILSFabric",
                "ILSGateway",
                "ILSIdentity",
                "ILSProxy",
                "ILSStore",
                "ILSStorePostgres",
                "ILSTesting",
                .product(name: "NIOEmbedded", package: "swift-nio"),
                .product(name: "NIOHTTP2", package: "swift-nio-http2"),
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: swiftSettings
        ),
        .testTarget(
            name: "ILSOverlayTests",
            dependencies: [
                "ILSCore",
                "ILSClient",
                "ILSCrypto",
                "ILSSodium",
                "ILSFabric",
                "ILSProxy",
                "ILSTesting",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "Crypto", package: "swift-crypto"),
            ],
            swiftSettings: swiftSettings
        ),
        .testTarget(
            name: "ILSClientTests",
            dependencies: [
                "ILSCore",
                "ILSClient",
                "ILSDial",
                "ILSCrypto",
                "ILSFabric",
                "ILSTesting",
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOConcurrencyHelpers", package: "swift-nio"),
                .product(name: "NIOEmbedded", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
            ],
            swiftSettings: swiftSettings
        ),
        .testTarget(
            name: "ILSFabricTests",
            dependencies: [
                "ILSCore",
                "ILSCrypto",
                "ILSSodium",
                "ILSFabric",
                "ILSSplice",
                "ILSProxy",
                "ILSTesting",
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOEmbedded", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: swiftSettings
        ),
        .testTarget(
            name: "ILSCryptoTests",
            dependencies: [
                "ILSCore", "ILSCrypto", "ILSSodium", "ILSTesting", "CSodium",
                .product(name: "Crypto", package: "swift-crypto"),
            ],
            swiftSettings: swiftSettings
        ),
        .testTarget(
            name: "ILSControllerTests",
            dependencies: [
                "ILSCore",
                "ILSCrypto",
                "ILSController",
                "ILSStore",
                "ILSClient",
                "ILSFabric",
                "ILSTesting",
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOEmbedded", package: "swift-nio"),
                .product(name: "NIOHTTP2", package: "swift-nio-http2"),
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: swiftSettings
        ),
        .testTarget(
            name: "ILSTunnelTests",
            dependencies: [
                "ILSCore",
                "ILSClient",
                "ILSCrypto",
                "ILSFabric",
                "ILSTunnel",
                "ILSTesting",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOConcurrencyHelpers", package: "swift-nio"),
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: swiftSettings
        ),
        .testTarget(
            name: "ILSFuzzTests",
            dependencies: ["ILSFuzz"],
            swiftSettings: swiftSettings
        ),
        .testTarget(
            name: "ILSProxyTests",
            dependencies: [
                "ILSCore",
                "ILSProxy",
                "ILSGateway",
                "ILSTesting",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
                .product(name: "NIOEmbedded", package: "swift-nio"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: swiftSettings
        ),
    ]
)
