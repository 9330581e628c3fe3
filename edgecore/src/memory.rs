//! Process memory housekeeping.

/// Gives the memory a large transient job freed back to the system (glibc keeps freed heap
/// otherwise, and the process's RSS would stay at the job's peak).
pub fn release_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only returns free heap pages to the kernel; it has no preconditions.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// How often a running edgecore gives freed heap back ([`release_freed_memory_every`]).
pub const TRIM_INTERVAL: std::time::Duration = std::time::Duration::from_secs(60);

/// Gives freed heap back every `every`, for good. Bursts no single module knows about — a
/// link coming back with queued reports, a resync, a flood of pod events — free their memory
/// into glibc's free lists, which the process's RSS keeps counting (the soak saw an edge's
/// anonymous memory rise in steps at each link freeze, with no live heap behind the steps).
/// A trim of a heap this small takes well under a millisecond.
pub async fn release_freed_memory_every(every: std::time::Duration) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tick.tick().await;
        release_freed_memory();
    }
}

/// Malloc arenas the process may use. glibc gives every thread that allocates concurrently an
/// arena of its own (up to eight per core); memory a burst frees in one arena cannot serve
/// another, so after a burst (thousands of objects arriving at once) the RSS stays at the
/// sum of every arena's peak. Two arenas: measured with 1,000 Services and 10,000 endpoints,
/// edgecore with edgemesh stayed 8 MB above an idle edge instead of 18 MB (BENCHMARKS.md).
pub const MALLOC_ARENAS: i32 = 2;

/// Limits glibc's malloc arenas ([`MALLOC_ARENAS`]); call before any thread starts. A
/// `MALLOC_ARENA_MAX` in the environment wins.
pub fn limit_malloc_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    if std::env::var_os("MALLOC_ARENA_MAX").is_none() {
        // SAFETY: mallopt only changes an allocator tunable; called before other threads run.
        unsafe {
            libc::mallopt(libc::M_ARENA_MAX, MALLOC_ARENAS);
        }
    }
}
