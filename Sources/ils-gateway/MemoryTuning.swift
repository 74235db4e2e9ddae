#if canImport(CMalloc)
import CMalloc
import Glibc

/// glibc's allocator, set for a long-running network process, before any thread starts:
/// - at most two arenas (glibc's default is 8 per core): NIO's event loops and Swift's cooperative pool otherwise each
///   grow an arena whose freed memory stays with it;
/// - a fixed mmap threshold of 1 MiB: glibc raises it (up to 32 MiB) every time a large block is freed, after which
///   large message buffers (WebSocket frames, upload chunks) come from the heap and fragment it instead of going
///   back to the system when they are freed. Fixed, it stays above the data path's per-turn buffers (TLS plaintext
///   and ciphertext buffers of one read turn or one flush, 256–512 KiB), which are allocated and freed thousands of
///   times a second under bulk transfer: served by `mmap` (the old 128 KiB threshold) each one cost a fresh mapping,
///   a page fault per 4 KiB on first touch and a TLB shootdown on `munmap` — a quarter of the controller's and
///   tunnel's CPU in a 1 GiB transfer through the overlay;
/// - a trim threshold of 4 MiB, so an arena keeps up to 4 MiB free at its top instead of returning (and faulting
///   back) every freed large buffer at once.
/// Measured through the overlay (1 GiB, tunnel → controller → gateway, release build, 2 cores): download 200 → 280
/// MiB/s and upload 178 → 302 MiB/s, the tunnel's and controller's CPU per byte down 40–45 %. The soak
/// (docs/soak.md) judges what this keeps: at most the trim threshold per arena, a level, not a slope.
/// `MALLOC_ARENA_MAX`, `MALLOC_MMAP_THRESHOLD_` or `MALLOC_TRIM_THRESHOLD_` in the environment wins.
enum MemoryTuning {
    static let mmapThreshold: Int32 = 1 << 20
    static let trimThreshold: Int32 = 4 << 20

    static func apply() {
        if getenv("MALLOC_ARENA_MAX") == nil { _ = mallopt(M_ARENA_MAX, 2) }
        if getenv("MALLOC_MMAP_THRESHOLD_") == nil { _ = mallopt(M_MMAP_THRESHOLD, mmapThreshold) }
        if getenv("MALLOC_TRIM_THRESHOLD_") == nil { _ = mallopt(M_TRIM_THRESHOLD, trimThreshold) }
    }

    /// Returns the free memory of every arena to the system, the holes below an arena's top included (glibc's
    /// `malloc_trim` releases those pages with `MADV_DONTNEED`): what the trim threshold alone never does for
    /// memory freed in the middle of a heap, such as the buffers of closed circuits.
    static func trim() {
        _ = malloc_trim(0)
    }
}
#else
enum MemoryTuning {
    static func apply() {}
    static func trim() {}
}
#endif
