import ILSFabric
import Testing

/// `LogTally`: one log line per key and interval, with the count (the relay's refusals, refused overlay connections,
/// resumptions).
@Suite("LogTally: one line per key and interval")
struct LogTallyTests {
    @Test("a flood of events is one log line per key per interval, the next one with the count since the last")
    func logTallyIsOneLinePerInterval() {
        let tally = LogTally<String>(interval: .seconds(60))
        let start = ContinuousClock.now
        var lines: [Int] = []
        for second in 0..<120 {
            if let count = tally.record(key: "a", now: start + .seconds(second)) { lines.append(count) }
        }
        #expect(lines == [1, 60])
        // Another key has its own interval.
        #expect(tally.record(key: "b", now: start + .seconds(119)) == 1)
    }
}
