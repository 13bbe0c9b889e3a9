//! Counters for `GET /metrics`, in the Prometheus text format.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};

/// Upper bounds (seconds) of the run-duration histogram.
const BUCKETS: [f64; 10] = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0, 30.0];

#[derive(Default)]
pub struct Metrics {
    pub runs: AtomicU64,
    pub execs: AtomicU64,
    pub timeouts: AtomicU64,
    pub ooms: AtomicU64,
    pub pool_hits: AtomicU64,
    pub pool_misses: AtomicU64,
    pub rejected: AtomicU64,
    pub errors: AtomicU64,
    pub active_sessions: AtomicU64,
    pub sessions_created: AtomicU64,
    pub sessions_expired: AtomicU64,
    duration_buckets: [AtomicU64; BUCKETS.len()],
    duration_count: AtomicU64,
    duration_sum_us: AtomicU64,
}

pub fn inc(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

impl Metrics {
    /// Records a finished run or exec.
    pub fn observe(&self, seconds: f64, timed_out: bool, oom: bool) {
        for (bound, bucket) in BUCKETS.iter().zip(&self.duration_buckets) {
            if seconds <= *bound {
                inc(bucket);
            }
        }
        inc(&self.duration_count);
        self.duration_sum_us
            .fetch_add((seconds * 1e6) as u64, Ordering::Relaxed);
        if timed_out {
            inc(&self.timeouts);
        }
        if oom {
            inc(&self.ooms);
        }
    }

    pub fn render(&self) -> String {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let mut out = String::new();
        let counters = [
            ("kennel_runs_total", "One-shot runs finished.", &self.runs),
            (
                "kennel_session_execs_total",
                "Session execs finished.",
                &self.execs,
            ),
            (
                "kennel_timeouts_total",
                "Runs and execs that timed out.",
                &self.timeouts,
            ),
            (
                "kennel_oom_kills_total",
                "Runs and execs killed for memory.",
                &self.ooms,
            ),
            (
                "kennel_pool_hits_total",
                "Runs served by a pre-started sandbox.",
                &self.pool_hits,
            ),
            (
                "kennel_pool_misses_total",
                "Runs that had to start cold.",
                &self.pool_misses,
            ),
            (
                "kennel_rejected_requests_total",
                "Requests refused (4xx, 429).",
                &self.rejected,
            ),
            (
                "kennel_errors_total",
                "Requests that failed inside Kennel (5xx).",
                &self.errors,
            ),
            (
                "kennel_sessions_created_total",
                "Sessions created.",
                &self.sessions_created,
            ),
            (
                "kennel_sessions_expired_total",
                "Sessions ended by TTL or lifetime.",
                &self.sessions_expired,
            ),
        ];
        for (name, help, c) in counters {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {}",
                get(c)
            );
        }
        let _ = writeln!(
            out,
            "# HELP kennel_active_sessions Sessions open now.\n# TYPE kennel_active_sessions gauge\nkennel_active_sessions {}",
            get(&self.active_sessions)
        );
        let name = "kennel_run_duration_seconds";
        let _ = writeln!(
            out,
            "# HELP {name} Wall-clock time of runs and execs.\n# TYPE {name} histogram"
        );
        for (bound, bucket) in BUCKETS.iter().zip(&self.duration_buckets) {
            let _ = writeln!(out, "{name}_bucket{{le=\"{bound}\"}} {}", get(bucket));
        }
        let count = get(&self.duration_count);
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {count}");
        let _ = writeln!(
            out,
            "{name}_sum {}",
            get(&self.duration_sum_us) as f64 / 1e6
        );
        let _ = writeln!(out, "{name}_count {count}");
        out
    }
}
