#!/usr/bin/env python3
"""Removes each transition of the state machines (HTTP mode's, a circuit's paths, a gateway's links) once and checks that a test catches it.

    deploy/check-machine-mutations.py [--only NAME] [--scratch PATH]

For each mutation below: apply it to the source, build the tests, run the machines' suites, and record which tests
failed. The source is restored after each one, whatever happens. The run fails if any mutation leaves every test
green (a transition no test would miss), or if the unmutated suites fail. It prints one line per mutation.

About 30 s of incremental build and test per mutation on 2 cores, 40 minutes for all of them; issue 27's note
records a run. CI runs `--ci` (the `CI` list below, about 5 minutes): every mutation of the circuit channel and four of
its paths machine, the ones a resumption's safety rests on (issue 49).
"""

import argparse
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
CONNECTION = "Sources/ILSProxy/ProxyConnectionMachine.swift"
EXCHANGE = "Sources/ILSProxy/ExchangeMachine.swift"
PATHS = "Sources/ILSFabric/CircuitPathMachine.swift"
CHANNEL = "Sources/ILSFabric/CircuitChannel.swift"
LINKS = "Sources/ILSGateway/LinkMachine.swift"
FILTER = (
    "ILSProxyTests.(ProxyConnectionMachine|ExchangeMachine)|ILSFabricTests.(CircuitPathMachine|CircuitChannelLifecycle)Tests"
    "|ILSGatewayTests.LinkMachineTests"
)

# (name, file, text to find, replacement). Each removes or inverts one transition or one rule.
MUTATIONS = [
    ("T1 head starts no body deadline", CONNECTION,
     "        state = .awaitingBackend(exchange)\n        bodyProgress = now\n",
     "        state = .awaitingBackend(exchange)\n"),
    ("T2 refused head is leased anyway", CONNECTION,
     "        if let refusal = exchange.refusal { return refuse(refusal, exchange, release: nil, now: now) }\n", ""),
    ("T3 head while closing closes", CONNECTION,
     "            // A pipelined request behind one that closes the connection is not answered; the close is on its way.\n"
     "            return .none\n",
     "            return .close\n"),
    ("T4 head mid-exchange ignored", CONNECTION,
     "            // HTTPServerPipelineHandler serialises requests, so a second head mid-exchange is a broken pipeline.\n"
     "            return .close\n",
     "            return .none\n"),
    ("T5 no 100 Continue", CONNECTION,
     "return .startForwarding(exchange, backend, writeContinue: writeContinue, resumeRead: resumeRead)",
     "return .startForwarding(exchange, backend, writeContinue: false, resumeRead: resumeRead)"),
    ("T5 held read not resumed", CONNECTION,
     "            if resumeRead { readHeld = false }\n"
     "            return .startForwarding(exchange, backend, writeContinue: writeContinue, resumeRead: resumeRead)",
     "            return .startForwarding(exchange, backend, writeContinue: writeContinue, resumeRead: false)"),
    ("T6 failed lease ignored", CONNECTION,
     "        case .failure(let error):\n            return .other(refuse(error, exchange, release: nil, now: now))\n",
     "        case .failure:\n            return .other(.none)\n"),
    ("T7 stale lease taken", CONNECTION,
     "guard case .awaitingBackend(let current) = state, current === exchange else {",
     "guard case .awaitingBackend = state else {"),
    ("T8 finish keeps a held read", CONNECTION,
     "                resumeRead = readHeld\n                readHeld = false\n",
     "                resumeRead = false\n"),
    ("T9 closing finish idles", CONNECTION,
     "            if closeClient {\n                state = .closing(since: now)",
     "            if closeClient {\n                state = .idle(since: now)"),
    ("T10 no retry", CONNECTION,
     "        case .retry:\n            state = .awaitingBackend(exchange)\n            return .retry(exchange)\n",
     "        case .retry:\n            return refuse(.backendReset, exchange, release: nil, now: now)\n"),
    ("T11 mid-response death answered", CONNECTION,
     "            state = .closing(since: now)\n            return .cut(exchange, outcome: \"backend_closed_mid_response\", release: nil)",
     "            return refuse(.backendReset, exchange, release: nil, now: now)"),
    ("T12 backend reset ignored", CONNECTION,
     "        case .refuse(let error):\n            return refuse(error, exchange, release: nil, now: now)\n        }\n    }\n\n    // MARK: Time",
     "        case .refuse:\n            return .none\n        }\n    }\n\n    // MARK: Time"),
    ("T13 no header timeout", CONNECTION,
     "            if let due = exchange.machine.headerDeadline, due <= now {\n"
     "                return refuse(.backendTimeout, exchange, release: backend, now: now)\n            }\n", ""),
    ("T14 backpressure not considered", CONNECTION,
     "            if readHeld || !backendWritable {", "            if false {"),
    ("T14 no body timeout", CONNECTION,
     "            return refuse(.requestBodyTimeout, exchange, release: backend, now: now)\n        case .upgrading, .closed:",
     "            return .none\n        case .upgrading, .closed:"),
    ("T14 waiting for a backend counts against the client", CONNECTION,
     "            if exchange.machine.awaitsRequestBody { bodyProgress = Swift.max(bodyProgress, now) }\n", ""),
    ("T15/T16 101 not held", CONNECTION,
     "        case .holdSwitch:\n            return .other(.none)\n",
     "        case .holdSwitch:\n            return .writeHead(exchange, closeClient: false)\n"),
    ("T16 no upgrade", CONNECTION,
     "        case .upgrade(let head):\n            state = .upgrading\n",
     "        case .upgrade(let head):\n            state = .closing(since: now)\n"),
    ("T18 client gone leaves the backend", CONNECTION,
     "            return .abandon(exchange, release: backend)", "            return .abandon(exchange, release: nil)"),
    ("T18 client gone while waiting not logged", CONNECTION,
     "        case .awaitingBackend(let exchange):\n            return .abandon(exchange, release: nil)\n        case .idle, .closing, .upgrading, .closed:\n            return .none\n        }\n    }\n\n    /// The client's bytes",
     "        case .awaitingBackend, .idle, .closing, .upgrading, .closed:\n            return .none\n        }\n    }\n\n    /// The client's bytes"),
    ("T19 garbage while closing answered", CONNECTION,
     "            // While the last answer is being written, later garbage must not cut it short.\n            return .none\n",
     "            return refuse(answer, nil, release: nil, now: now)\n"),
    ("T19 garbage mid-forward does not release", CONNECTION,
     "            return refuse(answer, exchange, release: backend, now: now)\n        case .awaitingBackend, .forwarding, .upgrading, .closed:",
     "            return refuse(answer, exchange, release: nil, now: now)\n        case .awaitingBackend, .forwarding, .upgrading, .closed:"),
    ("T20 no cut after the head", CONNECTION,
     "        if let exchange, exchange.machine.responseHeadSent {\n", "        if let exchange, false {\n"),
    ("idle deadline ignored", CONNECTION,
     "            return since + timeouts.idle <= now ? .close : .none\n", "            return .none\n"),
    ("closing deadline ignored", CONNECTION,
     "            return since + timeouts.closing <= now ? .close : .none\n", "            return .none\n"),
    ("stall ignored", CONNECTION,
     "        if let stalledSince, stalledSince + timeouts.stall <= now {", "        if let stalledSince, false {"),
    ("stall never cleared", CONNECTION,
     "        if isWritable {\n            stalledSince = nil\n        } else if", "        if isWritable {\n        } else if"),
    ("backend reads not held", CONNECTION,
     "        if case .forwarding(_, let backend) = state { return .setBackendReads(backend, allowed: isWritable) }\n", ""),
    ("next deadline without the header", CONNECTION,
     "Self.earliest(stall, Self.earliest(exchange.machine.headerDeadline, body))", "Self.earliest(stall, body)"),
    ("body parts not buffered", CONNECTION,
     "            exchange.bytesIn += bytes\n            return .buffer(exchange)\n", "            return .none\n"),
    ("half-close between exchanges ignored", CONNECTION,
     "        guard case .idle = state else { return .none }\n        state = .closing(since: now)\n        return .close\n",
     "        return .none\n"),
    ("half-close mid-exchange keeps the connection", CONNECTION,
     "            let closeClient = keepAliveEnds || inputEnded", "            let closeClient = keepAliveEnds"),
    ("backend never flushed", CONNECTION,
     "        if case .forwarding(_, let backend) = state { return .flushBackend(backend) }\n", ""),
    ("reads pass while waiting", CONNECTION,
     "        case .awaitingBackend:\n            readHeld = true\n            return false\n",
     "        case .awaitingBackend:\n            return true\n"),
    ("reads pass whatever the backend", CONNECTION,
     "            guard backendWritable else {\n                readHeld = true\n                return false\n            }\n", ""),
    ("held read never resumed by the backend", CONNECTION,
     "        guard readHeld, case .forwarding = state else { return false }", "        guard false else { return false }"),
    ("body before a head written", CONNECTION,
     "        guard exchange.machine.responseHeadSent else {", "        guard true else {"),
    ("exchange: upgrade keeps the client", EXCHANGE,
     "(forwarded?.clientWantsClose ?? true) || isUpgrade ? .close : .keepAlive",
     "(forwarded?.clientWantsClose ?? true) ? .close : .keepAlive"),
    ("exchange: any method replayed", EXCHANGE,
     "!$0.hasBody && !$0.isUpgrade && idempotent.contains(method)", "!$0.hasBody && !$0.isUpgrade"),
    ("exchange: 100 Continue every time", EXCHANGE,
     "        guard expectation == .owed else { return false }", "        guard expectation != .notAsked else { return false }"),
    ("exchange: HTTP/1.0 kept alive", EXCHANGE, "        if isHTTP10 { client = .close }\n", ""),
    ("exchange: unsolicited 101 held", EXCHANGE,
     "            guard isUpgrade else {", "            guard isUpgrade || true else {"),
    ("exchange: early answer keeps both", EXCHANGE,
     "            backend = .close\n            client = .close\n        }\n        return .finish", "        }\n        return .finish"),
    ("exchange: a fresh connection retried", EXCHANGE,
     "        attempt == .first(reused: true) && isReplayable", "        attempt != .retried && isReplayable"),
    ("exchange: garbage retried", EXCHANGE,
     "        if !invalidResponse, isRetryable {", "        if isRetryable {"),
    ("exchange: a second head forwarded", EXCHANGE,
     "        guard case .awaitingHead = response else {\n            backend = .close\n            return .refuse(.backendInvalidResponse)\n        }\n",
     ""),
    ("stall: the cut keeps the exchange and its backend", CONNECTION,
     "            case .forwarding(let exchange, let backend): return .stalled(exchange, release: backend)\n",
     "            case .forwarding: return .stalled(nil, release: nil)\n"),
    ("stall: the machine stays open after the cut", CONNECTION,
     "            // Not writable since then: the client stopped reading. The backend request ends with it.\n"
     "            defer { state = .closed }\n",
     "            // Not writable since then: the client stopped reading. The backend request ends with it.\n"),
    ("paths: a lost path ends a resumable circuit", PATHS,
     "            guard resumable, grace > .zero, !isSettled else {", "            guard false else {"),
    ("paths: a lost path holds a circuit both ends ended", PATHS,
     "            guard resumable, grace > .zero, !isSettled else {", "            guard resumable, grace > .zero else {"),
    ("paths: a lost path ends a circuit whose FINAL the peer may not have", PATHS,
     "    package var isSettled: Bool { isDone && (outputAcknowledged || !resumable) }",
     "    package var isSettled: Bool { isDone }"),
    ("paths: END_STREAM before the peer has our FINAL", PATHS,
     "        guard !resumable || isSettled else { return false }\n", ""),
    ("paths: END_STREAM twice on one path", PATHS,
     "guard outputEnded, !pathOutputEnded, state == .attached || state == .handshaking else { return false }",
     "guard outputEnded, state == .attached || state == .handshaking else { return false }"),
    ("paths: a new path gets no END_STREAM", PATHS,
     "        state = .attached\n        pathOutputEnded = false\n        return true\n    }\n\n    /// The device's next",
     "        state = .attached\n        return true\n    }\n\n    /// The device's next"),
    ("paths: a clean close resets the path", PATHS,
     "        guard resumable, state == .attached, isDone else { return .reset }",
     "        return .reset"),
    ("paths: a cut close ends the path cleanly", PATHS,
     "        guard resumable, state == .attached, isDone else { return .reset }",
     "        guard resumable, state == .attached else { return .reset }"),
    ("paths: a lost path holds a circuit mid-handshake", PATHS,
     "        case .handshaking:\n            state = .closed\n            return .end\n",
     "        case .handshaking:\n            return .none\n"),
    ("paths: a replay accepted", PATHS,
     "            return attempt > lastAttempt ? .attach : .refuse(reason: \"the resumption was replayed\")",
     "            return .attach"),
    ("paths: an accepted attempt not recorded", PATHS,
     "        lastAttempt = attempt\n        state = .attached\n        pathOutputEnded = false\n        return true\n",
     "        state = .attached\n        pathOutputEnded = false\n        return true\n"),
    ("paths: a resumption after the window", PATHS,
     "        case .held(let deadline) where now > deadline:\n            return .refuse(reason: \"the circuit's grace window ran out\")\n",
     ""),
    ("paths: the grace timer ignores the deadline", PATHS,
     "        guard case .held(let deadline) = state, now >= deadline else { return false }",
     "        guard case .held = state else { return false }"),
    ("paths: the device's attempts do not count up", PATHS,
     "        lastAttempt += 1\n        return lastAttempt", "        return lastAttempt + 1"),
    # The channel that carries out the paths machine's decisions (CircuitChannelLifecycleTests).
    ("paths: channel: the grace window on the wall clock", CHANNEL,
     "        switch machine.pathLost(now: eventLoop.now) {", "        switch machine.pathLost(now: .now()) {"),
    ("paths: channel: still held to others after the window", CHANNEL,
     "        guard machine.graceExpired(now: eventLoop.now) else { return }\n        machineChanged()\n",
     "        guard machine.graceExpired(now: eventLoop.now) else { return }\n"),
    ("paths: channel: no low watermark", CHANNEL,
     "            let next = writable && (flags.writable || belowLow)", "            let next = writable"),
    ("paths: channel: remote half-closure ignored", CHANNEL,
     "        guard allowRemoteHalfClosure else {", "        guard allowRemoteHalfClosure || true else {"),
    ("paths: channel: a resumption sends nothing again", CHANNEL,
     "        for frame in retained { new.write(frame, promise: nil) }\n", ""),
    ("paths: channel: a resumed circuit still counts as held", CHANNEL,
     "is on another loop\")\n        releaseHold()\n", "is on another loop\")\n"),
    ("links: an answer before the connect is dropped", LINKS,
     "        case .dialling(_, let stale): return !stale\n", "        case .dialling: return false\n"),
    ("links: the connect resets an answer that came first", LINKS,
     "        case .linked(let link) where link.connection == connection:\n            break  // the controller's answer came first\n",
     ""),
    ("links: another connection's answer binds the dialled one", LINKS,
     "            state = .linked(Link(connection: connection, certificate: link.certificate, binding: .awaiting))\n        case .idle:",
     "            break\n        case .idle:"),
    ("links: a renewal during a dial keeps its connection", LINKS,
     "        case .dialling(_, stale: true):\n            state = .idle\n            return .replace\n",
     "        case .dialling(let certificate, stale: true):\n"
     "            state = .linked(Link(connection: connection, certificate: certificate, binding: .awaiting))\n"),
    ("links: connected after stop is kept", LINKS,
     "        case .stopped:\n            return .close\n        case .dialling(let certificate, stale: false):",
     "        case .stopped:\n            return .keep\n        case .dialling(let certificate, stale: false):"),
    ("links: a stopped link dials", LINKS,
     "        guard state != .stopped else { return false }\n        state = .dialling", "        state = .dialling"),
    ("links: a failed dial after stop dials again", LINKS,
     "        guard state != .stopped else { return .stop }\n        state = .idle\n        return .dial(after: backoff.failed()",
     "        state = .idle\n        return .dial(after: backoff.failed()"),
    ("links: a refused link can be bound", LINKS,
     "            guard link.binding == .awaiting else { return .stale }\n", ""),
    ("links: a taken relay loop is bound", LINKS,
     "        if loopTaken {\n", "        if false {\n"),
    ("links: duplicates never stop being quick", LINKS,
     "            duplicates += 1\n", ""),
    ("links: a loop of its own keeps the duplicate count", LINKS,
     "        duplicates = 0\n        state = .linked", "        state = .linked"),
    ("links: a refusal of another connection applies", LINKS,
     "    mutating func refused(_ connection: Connection, reason: String, code: String?) -> Bool {\n        guard accepts(connection) else { return false }\n",
     "    mutating func refused(_ connection: Connection, reason: String, code: String?) -> Bool {\n"),
    ("links: a renewal leaves the link in use", LINKS,
     "        case .linked(let link):\n            state = .idle\n            return link.connection\n",
     "        case .linked:\n            return nil\n"),
    ("links: a renewal during a dial is forgotten", LINKS,
     "            state = .dialling(certificate: certificate, stale: true)\n            return nil\n", "            return nil\n"),
    ("links: a stopped link's end dials again", LINKS,
     "        if state == .stopped { return .stop }\n", ""),
    ("links: a rotated link waits before the new dial", LINKS,
     "            return .dial(after: .zero, because: .rotated)\n", "            return .dial(after: backoff.failed(), because: .rotated)\n"),
    ("links: a refusal waits as a lost link", LINKS,
     "            return .dial(after: backoff.refused(code: code), because: .refused(code: code))",
     "            return .dial(after: backoff.failed(), because: .refused(code: code))"),
    ("links: a binding does not reset the backoff", LINKS,
     "        case .bound:\n            backoff.bound()\n", "        case .bound:\n"),
    ("links: a bound link's loss is not told apart", LINKS,
     "because: .lost(wasBound: true))", "because: .lost(wasBound: false))"),
    ("links: stop hands back no connection", LINKS,
     "        return link?.connection\n", "        return nil\n"),
    ("exchange: end without a head finishes", EXCHANGE,
     "        case .awaitingHead, .complete:\n            backend = .close\n            return .refuse(.backendInvalidResponse)\n",
     "        case .awaitingHead, .complete:\n            break\n"),
]


# What CI runs (--ci): the circuit channel's mutations, and the paths machine's on which a resumption's safety rests.
CI = [name for name, path, _, _ in MUTATIONS if path == CHANNEL] + [
    "paths: a lost path ends a resumable circuit",
    "paths: END_STREAM before the peer has our FINAL",
    "paths: a replay accepted",
    "paths: a resumption after the window",
]


def run(command, scratch):
    extra = ["--scratch-path", scratch] if scratch else []
    return subprocess.run(command + extra, cwd=ROOT, capture_output=True, text=True)


def failed_tests(output):
    return sorted(set(re.findall(r'✘ Test "([^"]+)"(?: with \d+ test cases)? (?:failed|recorded)', output)))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", help="run the mutations whose name contains this")
    parser.add_argument("--ci", action="store_true", help="run CI's mutations only (the CI list)")
    parser.add_argument("--scratch", help="the build directory (swift's --scratch-path)")
    args = parser.parse_args()

    build = ["swift", "build", "--build-tests"]
    test = ["swift", "test", "--skip-build", "--filter", FILTER]
    baseline = run(build, args.scratch)
    if baseline.returncode != 0:
        sys.exit("the unmutated source does not build:\n" + baseline.stdout[-3000:] + baseline.stderr[-3000:])
    clean = run(test, args.scratch)
    if clean.returncode != 0:
        sys.exit("the unmutated suites fail:\n" + "\n".join(failed_tests(clean.stdout)))

    survivors = []
    for name, path, old, new in MUTATIONS:
        if args.only and args.only not in name or args.ci and name not in CI:
            continue
        file = ROOT / path
        original = file.read_text()
        if original.count(old) != 1:
            sys.exit(f"{name}: the text to mutate occurs {original.count(old)} times in {path}, not once")
        try:
            file.write_text(original.replace(old, new))
            built = run(build, args.scratch)
            if built.returncode != 0:
                print(f"{name}: caught by the compiler", flush=True)
                continue
            result = run(test, args.scratch)
            caught = failed_tests(result.stdout)
            if result.returncode == 0:
                survivors.append(name)
                print(f"{name}: NOT CAUGHT", flush=True)
            else:
                print(f"{name}: caught by {len(caught)}: " + "; ".join(caught), flush=True)
        finally:
            file.write_text(original)
    run(build, args.scratch)
    if survivors:
        sys.exit(f"{len(survivors)} mutation(s) no test caught: " + ", ".join(survivors))
    print("every mutation was caught")


if __name__ == "__main__":
    main()
