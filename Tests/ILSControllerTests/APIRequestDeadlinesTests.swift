import NIOCore
import Testing

@testable import ILSController

@Suite("API request deadlines (state machine)")
struct APIRequestDeadlinesTests {
    let timeouts = APIRequestDeadlines.Timeouts(head: .seconds(10), body: .seconds(20), idle: .seconds(30))
    let start = NIODeadline.uptimeNanoseconds(1_000_000_000)

    @Test("a head trickled a byte at a time keeps the deadline set when the connection started, and gets a 408")
    func trickledFirstHead() {
        var deadlines = APIRequestDeadlines(timeouts: timeouts, startedAt: start)
        for second in stride(from: 1, to: 10, by: 2) {
            deadlines.bytesArrived(now: start + .seconds(Int64(second)))
            #expect(deadlines.deadline == start + .seconds(10))
        }
        #expect(deadlines.timerFired(now: start + .seconds(10)) == .answerTimeoutAndClose)
        #expect(deadlines.deadline == nil)
    }

    @Test("a connection that sends nothing is closed without an answer when its first head is due")
    func silentConnection() {
        var deadlines = APIRequestDeadlines(timeouts: timeouts, startedAt: start)
        #expect(deadlines.timerFired(now: start + .seconds(10)) == .close)
    }

    @Test("a body trickled a byte at a time keeps the deadline set when its head arrived")
    func trickledBody() {
        var deadlines = APIRequestDeadlines(timeouts: timeouts, startedAt: start)
        deadlines.bytesArrived(now: start + .seconds(1))
        deadlines.headReceived(now: start + .seconds(2))
        for second in 3..<22 { deadlines.bytesArrived(now: start + .seconds(Int64(second))) }
        #expect(deadlines.deadline == start + .seconds(22))
        // A timer set for the head's deadline fires first: it waits for the body's.
        #expect(deadlines.timerFired(now: start + .seconds(10)) == .wait(until: start + .seconds(22)))
        #expect(deadlines.timerFired(now: start + .seconds(22)) == .answerTimeoutAndClose)
    }

    @Test("after an answer the connection may idle; the next head's deadline starts at its first byte")
    func keepAlive() {
        var deadlines = APIRequestDeadlines(timeouts: timeouts, startedAt: start)
        deadlines.bytesArrived(now: start)
        deadlines.headReceived(now: start)
        deadlines.responseSent(now: start + .seconds(1))
        #expect(deadlines.deadline == start + .seconds(31))
        deadlines.bytesArrived(now: start + .seconds(25))
        #expect(deadlines.deadline == start + .seconds(35))
        deadlines.bytesArrived(now: start + .seconds(30))
        #expect(deadlines.deadline == start + .seconds(35))
        #expect(deadlines.timerFired(now: start + .seconds(35)) == .answerTimeoutAndClose)
    }

    @Test("an idle keep-alive connection is closed without an answer")
    func idleKeepAlive() {
        var deadlines = APIRequestDeadlines(timeouts: timeouts, startedAt: start)
        deadlines.headReceived(now: start)
        deadlines.responseSent(now: start)
        #expect(deadlines.timerFired(now: start + .seconds(30)) == .close)
    }

    @Test("past a deadline nothing moves it again")
    func expiredStaysExpired() {
        var deadlines = APIRequestDeadlines(timeouts: timeouts, startedAt: start)
        deadlines.bytesArrived(now: start)
        _ = deadlines.timerFired(now: start + .seconds(10))
        deadlines.headReceived(now: start + .seconds(11))
        deadlines.responseSent(now: start + .seconds(11))
        deadlines.bytesArrived(now: start + .seconds(12))
        #expect(deadlines.state == .expired && deadlines.deadline == nil)
    }
}
