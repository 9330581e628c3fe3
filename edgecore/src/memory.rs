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
