public import ILSController
public import ILSFabric
public import ILSIdentity
public import NIOCore

/// The deadlines of a test cluster (`TestCluster`) that no test is about, in one place. Each is a hang guard
/// (`TestTiming.hangGuard`, stretched like it): a healthy run never comes near it, and a broken build fails after it
/// instead of hanging. The product's own values are for people and real networks (a controller's 10 s to answer, a
/// handshake's 10 s, a keepalive's 10 s silence); on 2 cores with the whole suite at once, or with every core busy
/// beside the tests (`deploy/flake-hunt.sh --busy`), they ran out in tests about something else (issue 48): a gateway
/// that gave up a handshake under load reset a circuit the device had already taken as resumable, and the app saw
/// `not_resumed` for an answer that was never cut.
///
/// A test about one of these deadlines sets its own (a `ControllerServer`, a gateway or a dialer of its own, or
/// `TestCluster.startGateway`'s parameters) and asserts what happens once it passes, not how fast.
public enum ClusterDeadlines {
    /// The answer to a request of the admin API or an enrollment (`ControllerClient.patient`).
    public static var controllerAnswer: TimeAmount { ControllerClient.patientTimeout }

    /// The gateway's bound on a device's end-to-end handshake (`E2EResponderHandler.handshakeTimeout`, 10 s).
    public static var e2eHandshake: TimeAmount { hangGuardAmount }

    /// A controller's bound on a TLS handshake (`ControllerServer.defaultHandshakeTimeout`, 10 s).
    public static var tlsHandshake: TimeAmount { hangGuardAmount }

    /// How long a controller waits for a gateway to take a circuit (`ControllerServer.defaultCircuitOpenTimeout`,
    /// 5 s): with the whole suite on two cores a gateway answering 100 circuits at once took longer than 5 s once.
    public static var circuitOpen: TimeAmount { hangGuardAmount }

    /// The controller links' keepalive: the standard PING interval, and a silence bound of the hang guard (10 s in
    /// the product), so a busy machine is not taken for a dead link. Fault tests that need a link found dead make
    /// their own dialer with a short one.
    public static var keepalive: FabricKeepalive {
        FabricKeepalive(interval: FabricKeepalive.standard.interval, timeout: hangGuardAmount)
    }

    /// The gateway's grace window for a held circuit (`CircuitRetention.defaultGrace`, 60 s): a device that resumes
    /// late on a busy machine must find its circuit. Tests of the window set their own.
    public static var resumeGrace: TimeAmount { hangGuardAmount }

    /// The hang guard as the event loop's time.
    static var hangGuardAmount: TimeAmount { ControllerClient.patientTimeout }
}
