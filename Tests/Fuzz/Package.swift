// swift-tools-version:6.1
import Foundation
import PackageDescription

/// The libFuzzer harness: one executable whose `LLVMFuzzerTestOneInput` runs the target named by `ILS_FUZZ_TARGET`
/// (see `FuzzTargets.all`). A package of its own, so that libFuzzer's `main` never meets the main package's
/// executables. Build it with `deploy/fuzz.sh`, which passes `-sanitize=fuzzer,address` to every Swift module.
///
/// The main package is a path dependency, whose identity is its directory's name.
let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().appendingPathComponent("../..").standardized

let package = Package(
    name: "ils-fuzz",
    platforms: [.macOS(.v14)],
    dependencies: [
        .package(path: "../..")
    ],
    targets: [
        .executableTarget(
            name: "ils-fuzz",
            dependencies: [.product(name: "ILSFuzz", package: root.lastPathComponent.lowercased())],
            swiftSettings: [
                .swiftLanguageMode(.v6),
                .enableUpcomingFeature("ExistentialAny"),
                .enableUpcomingFeature("InternalImportsByDefault"),
                .unsafeFlags(["-parse-as-library"]),
            ]
        )
    ]
)
