import Foundation
import ILSFuzz
import Testing

/// Every fuzz target's committed corpus and every past finding, replayed through the same entries libFuzzer
/// calls: a finding, once fixed, stays fixed. Set `ILS_FUZZ_WRITE_SEEDS=1` to regenerate `Tests/Fuzz/Corpus`.
@Suite struct FuzzCorpusTests {
    static let fuzzDirectory = URL(fileURLWithPath: #filePath)
        .deletingLastPathComponent().deletingLastPathComponent().appendingPathComponent("Fuzz")

    static func inputs(_ kind: String, _ target: String) throws -> [URL] {
        let directory = fuzzDirectory.appendingPathComponent(kind).appendingPathComponent(target)
        guard FileManager.default.fileExists(atPath: directory.path) else { return [] }
        return try FileManager.default.contentsOfDirectory(at: directory, includingPropertiesForKeys: nil)
            .filter { !$0.lastPathComponent.hasPrefix(".") }
            .sorted { $0.lastPathComponent < $1.lastPathComponent }
    }

    static func entry(_ name: String) throws -> FuzzTargets.Entry {
        try #require(FuzzTargets.all.first { $0.name == name }?.entry)
    }

    /// Runs `body` on a thread of its own, as libFuzzer calls the entries from its own thread: the controller API
    /// target waits there for the controller's asynchronous answers, which must not hold a thread of Swift's
    /// cooperative pool (the tests' own) while its tasks need one.
    static func onOwnThread(_ body: @escaping @Sendable () throws -> Void) async throws {
        try await withCheckedThrowingContinuation { (done: CheckedContinuation<Void, any Error>) in
            let thread = Thread {
                do {
                    try body()
                    done.resume()
                } catch {
                    done.resume(throwing: error)
                }
            }
            thread.stackSize = 8 << 20
            thread.start()
        }
    }

    @Test("the seed corpus of every target replays without a crash", arguments: FuzzTargets.all.map(\.name))
    func seedCorpusReplays(target: String) async throws {
        let entry = try Self.entry(target)
        let seeds = try Self.inputs("Corpus", target)
        #expect(!seeds.isEmpty, "Tests/Fuzz/Corpus/\(target) has no seeds")
        try await Self.onOwnThread {
            for seed in seeds {
                try Data(contentsOf: seed).withUnsafeBytes { entry($0) }
            }
        }
    }

    @Test("every past finding replays without a crash", arguments: FuzzTargets.all.map(\.name))
    func findingsStayFixed(target: String) async throws {
        let entry = try Self.entry(target)
        let findings = try Self.inputs("Regressions", target)
        try await Self.onOwnThread {
            for finding in findings {
                try Data(contentsOf: finding).withUnsafeBytes { entry($0) }
            }
        }
    }

    @Test("freshly generated seeds run through their targets")
    func generatedSeedsRun() async throws {
        let seeds = try FuzzSeeds.generate()
        #expect(Set(seeds.keys) == Set(FuzzTargets.all.map(\.name)))
        let write = ProcessInfo.processInfo.environment["ILS_FUZZ_WRITE_SEEDS"] == "1"
        try await Self.onOwnThread {
            try Self.run(seeds, write: write)
        }
    }

    private static func run(_ seeds: [String: [(name: String, bytes: [UInt8])]], write: Bool) throws {
        for (target, inputs) in seeds {
            let entry = try Self.entry(target)
            let directory = fuzzDirectory.appendingPathComponent("Corpus").appendingPathComponent(target)
            if write { try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true) }
            for input in inputs {
                input.bytes.withUnsafeBytes { entry($0) }
                if write { try Data(input.bytes).write(to: directory.appendingPathComponent(input.name)) }
            }
        }
    }

    @Test("an empty input is fine for every target", arguments: FuzzTargets.all.map(\.name))
    func emptyInput(target: String) async throws {
        let entry = try Self.entry(target)
        try await Self.onOwnThread { [UInt8]().withUnsafeBytes { entry($0) } }
    }
}
