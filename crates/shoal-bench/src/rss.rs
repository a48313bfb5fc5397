//! Resident memory of this process, from `/proc/self/status` (Linux; `None` elsewhere).
//!
//! [`reset_peak`] restarts the kernel's high-water mark (`VmHWM`) by writing `5` to
//! `/proc/self/clear_refs`, so that [`peak_kb`] read after a run gives that run's peak, not
//! the peak of the whole process so far.

/// Reads one `kB` field (`VmRSS`, `VmHWM`, ...) of `/proc/self/status`.
fn status_kb(field: &str) -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/status").ok()?;
    text.lines().find_map(|l| {
        let rest = l.strip_prefix(field)?.strip_prefix(':')?;
        rest.trim().trim_end_matches("kB").trim().parse().ok()
    })
}

/// Current resident set size in KiB.
pub fn current_kb() -> Option<u64> {
    status_kb("VmRSS")
}

/// Peak resident set size in KiB since the process started or the last [`reset_peak`].
pub fn peak_kb() -> Option<u64> {
    status_kb("VmHWM")
}

/// Resets the peak to the current resident set size; returns whether the kernel allowed it.
pub fn reset_peak() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_rss_on_linux() {
        if cfg!(target_os = "linux") {
            let cur = current_kb().unwrap();
            assert!(cur > 0);
            reset_peak();
            assert!(peak_kb().unwrap() >= cur / 2);
        }
    }
}
