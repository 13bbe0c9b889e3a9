//! Which server process keeps a row of the job table or a session's record: its PID and
//! start time (which tells it from a later process given the same PID).

/// Process `pid` as a row names it: `pid:start time`, while it runs.
fn identity(pid: u32) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 2..];
    let start = rest.split_whitespace().nth(19)?;
    Some(format!("{pid}:{start}"))
}

/// This process, as a row names it.
pub fn me() -> String {
    identity(std::process::id()).unwrap_or_default()
}

/// Whether the server process a row names still runs.
pub fn alive(owner: &str) -> bool {
    let Some(pid) = owner.split(':').next().and_then(|p| p.parse().ok()) else {
        return false;
    };
    identity(pid).as_deref() == Some(owner)
}
