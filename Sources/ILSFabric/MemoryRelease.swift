/// Hands freed memory back to the system (`release`: `malloc_trim`, from the executable) at most every `interval`,
/// and only when `closed` (a count of circuits that have closed) moved since the last look: what closed circuits kept
/// is freed in the middle of the heap, where the allocator's trim threshold never returns it. The controller and the
/// gateway run it for as long as they run (cancel the task to stop it).
public enum MemoryRelease {
    public static let interval: Duration = .seconds(10)

    public static func run(
        every interval: Duration = MemoryRelease.interval,
        closed: () -> Int,
        release: () -> Void
    ) async {
        var seen = closed()
        // Sleep: a release is a periodic chore (at most one per interval), not a wait for an event.
        while (try? await Task.sleep(for: interval)) != nil {
            let now = closed()
            guard now != seen else { continue }
            seen = now
            release()
        }
    }
}
