#if canImport(CMalloc)
import CMalloc
import Glibc

/// glibc's allocator, set for a long-running network process, before any thread starts:
/// - at most two arenas (glibc's default is 8 per core): NIO's event loops and Swift's cooperative pool otherwise each
///   grow an arena whose freed memory stays with it;
/// - a fixed mmap threshold of 128 KiB: glibc raises it (up to 32 MiB) every time a large block is freed, after which
///   large message buffers (WebSocket frames, upload chunks) come from the heap and fragment it instead of going
///   back to the system when they are freed.
/// The soak (docs/soak.md) measured both: without them a gateway's RSS floor crept up by hundreds of KiB a minute
/// under steady WebSocket-heavy load. `MALLOC_ARENA_MAX` or `MALLOC_MMAP_THRESHOLD_` in the environment wins.
enum MemoryTuning {
    static func apply() {
        if getenv("MALLOC_ARENA_MAX") == nil { _ = mallopt(M_ARENA_MAX, 2) }
        if getenv("MALLOC_MMAP_THRESHOLD_") == nil { _ = mallopt(M_MMAP_THRESHOLD, 128 * 1024) }
    }
}
#else
enum MemoryTuning {
    static func apply() {}
}
#endif
