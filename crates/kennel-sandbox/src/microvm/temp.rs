//! Names of files written whole and renamed into place.

/// A temporary file name for a cache entry (`stem` is the entry's), unique to this call:
/// threads of one process (a server filling a pool of two clones) may make the same entry at
/// once, each into a file of its own, so that the last rename wins with a whole one (with the
/// process id alone they wrote into one file, and a corrupt disk was kept).
pub(super) fn temp_name(stem: &str) -> String {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!(".{stem}.{}-{n}.tmp", std::process::id())
}
