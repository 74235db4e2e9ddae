public import ILSIdentity
public import NIOCore

extension ControllerClient {
    /// This client as a test uses it when the controller's deadline is not what the test checks: it waits for the
    /// answer up to `TestTiming.hangGuard`, as for any event that must come. The 10 s default is for a person at a
    /// terminal; with the whole suite running at once on a loaded 2-core machine, an admin read of a healthy
    /// controller once took longer than that (CI at the end of session 37, AuditLogTests' pagination).
    public var patient: ControllerClient {
        var client = self
        client.timeout = Self.patientTimeout
        return client
    }

    /// `TestTiming.hangGuard`, as a deadline for one answer (`Enrollment.enroll(answerTimeout:)` too).
    public static var patientTimeout: TimeAmount {
        let (seconds, attoseconds) = TestTiming.hangGuard.components
        return .nanoseconds(seconds * 1_000_000_000 + attoseconds / 1_000_000_000)
    }
}
