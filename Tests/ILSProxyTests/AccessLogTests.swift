import Testing

@testable import ILSProxy

@Suite("The access line's fields")
struct AccessLogTests {
    @Test("duration is milliseconds with three decimals, from whole microseconds, never negative")
    func durationMilliseconds() {
        #expect(AccessLog.milliseconds(0) == "0.000")
        #expect(AccessLog.milliseconds(999) == "0.000")
        #expect(AccessLog.milliseconds(5_000) == "0.005")
        #expect(AccessLog.milliseconds(50_000) == "0.050")
        #expect(AccessLog.milliseconds(1_234_567) == "1.234")
        #expect(AccessLog.milliseconds(12_000_000_000) == "12000.000")
        #expect(AccessLog.milliseconds(-3_000_000) == "0.000")
    }
}
