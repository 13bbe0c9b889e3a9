//! The counters of `GET /metrics`, kept and encoded by `prometheus-client`.
//!
//! The library writes OpenMetrics, which is what Prometheus asks for first. A scraper that does
//! not ask for it (or `curl`) gets the classic text format (`text/plain; version=0.0.4`), in
//! which a counter's family is named with its `_total` and there is no `# EOF`: see
//! [`Format`].

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// Upper bounds (seconds) of the run-duration histogram.
const BUCKETS: [f64; 10] = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0, 30.0];

#[derive(Debug)]
pub struct Metrics {
    pub runs: Counter,
    pub execs: Counter,
    pub timeouts: Counter,
    pub ooms: Counter,
    pub pool_hits: Counter,
    pub pool_misses: Counter,
    pub rejected: Counter,
    pub errors: Counter,
    pub active_sessions: Gauge,
    pub sessions_created: Counter,
    pub sessions_expired: Counter,
    /// Security events by kind (`denied_syscall`, `network_refused`, `limit_hit`).
    pub security_events: Family<Vec<(String, String)>, Counter>,
    /// Denied system calls by name (each counted as often as the code made it).
    pub denied_syscalls: Family<Vec<(String, String)>, Counter>,
    duration: Histogram,
    registry: Registry,
}

pub fn inc(counter: &Counter) {
    counter.inc();
}

impl Default for Metrics {
    fn default() -> Metrics {
        let m = Metrics {
            runs: Counter::default(),
            execs: Counter::default(),
            timeouts: Counter::default(),
            ooms: Counter::default(),
            pool_hits: Counter::default(),
            pool_misses: Counter::default(),
            rejected: Counter::default(),
            errors: Counter::default(),
            active_sessions: Gauge::default(),
            sessions_created: Counter::default(),
            sessions_expired: Counter::default(),
            security_events: Family::default(),
            denied_syscalls: Family::default(),
            duration: Histogram::new(BUCKETS),
            registry: Registry::default(),
        };
        let mut registry = Registry::default();
        // Counters are registered without `_total`: the encoder adds it to the sample. The
        // library ends each help with a full stop.
        let counters = [
            ("kennel_runs", "One-shot runs finished", &m.runs),
            ("kennel_session_execs", "Session execs finished", &m.execs),
            (
                "kennel_timeouts",
                "Runs and execs that timed out",
                &m.timeouts,
            ),
            (
                "kennel_oom_kills",
                "Runs and execs killed for memory",
                &m.ooms,
            ),
            (
                "kennel_pool_hits",
                "Runs and microvm sessions served by a pre-started sandbox",
                &m.pool_hits,
            ),
            (
                "kennel_pool_misses",
                "Runs and microvm sessions that had to start cold",
                &m.pool_misses,
            ),
            (
                "kennel_rejected_requests",
                "Requests refused (4xx, 429)",
                &m.rejected,
            ),
            (
                "kennel_errors",
                "Requests that failed inside Kennel (5xx)",
                &m.errors,
            ),
            (
                "kennel_sessions_created",
                "Sessions created",
                &m.sessions_created,
            ),
            (
                "kennel_sessions_expired",
                "Sessions ended by TTL or lifetime",
                &m.sessions_expired,
            ),
        ];
        for (name, help, counter) in counters {
            registry.register(name, help, counter.clone());
        }
        registry.register(
            "kennel_security_events",
            "Security events of runs, by kind",
            m.security_events.clone(),
        );
        registry.register(
            "kennel_denied_syscalls",
            "System calls the seccomp filter denied, by name",
            m.denied_syscalls.clone(),
        );
        registry.register(
            "kennel_active_sessions",
            "Sessions open now",
            m.active_sessions.clone(),
        );
        registry.register(
            "kennel_run_duration_seconds",
            "Wall-clock time of runs and execs",
            m.duration.clone(),
        );
        Metrics { registry, ..m }
    }
}

/// The exposition format a scraper gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// OpenMetrics 1.0, for a scraper whose `Accept` names it (Prometheus does).
    OpenMetrics,
    /// Prometheus' classic text format, for everyone else.
    Text,
}

impl Format {
    /// OpenMetrics when the `Accept` header offers it (with a q above 0), else the classic text.
    pub fn negotiate(accept: Option<&str>) -> Format {
        let offered = accept.unwrap_or("").split(',').any(|range| {
            let mut params = range.split(';').map(str::trim);
            let media = params.next().unwrap_or("");
            media.eq_ignore_ascii_case("application/openmetrics-text")
                && !params.any(|p| {
                    p.split_once('=').is_some_and(|(k, v)| {
                        k.trim().eq_ignore_ascii_case("q") && v.trim().parse() == Ok(0.0)
                    })
                })
        });
        if offered {
            Format::OpenMetrics
        } else {
            Format::Text
        }
    }

    pub fn content_type(self) -> &'static str {
        match self {
            Format::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
            Format::Text => "text/plain; version=0.0.4",
        }
    }
}

impl Metrics {
    /// Records a finished run or exec.
    /// Counts a result's security events: one per event by kind, each denied call by name.
    pub fn security(&self, events: &kennel_types::security::SecurityEvents) {
        use kennel_types::security::SecurityEvent;
        for e in &events.events {
            let label = vec![("kind".to_string(), e.kind().to_string())];
            self.security_events.get_or_create(&label).inc();
            if let SecurityEvent::DeniedSyscall { syscall, count, .. } = e {
                let label = vec![("syscall".to_string(), syscall.clone())];
                self.denied_syscalls.get_or_create(&label).inc_by(*count);
            }
        }
    }

    pub fn observe(&self, seconds: f64, timed_out: bool, oom: bool) {
        self.duration.observe(seconds);
        if timed_out {
            inc(&self.timeouts);
        }
        if oom {
            inc(&self.ooms);
        }
    }

    pub fn render(&self, format: Format) -> String {
        let mut open = String::new();
        encode(&mut open, &self.registry).expect("writing to a String cannot fail");
        match format {
            Format::OpenMetrics => open,
            Format::Text => classic_text(&open),
        }
    }
}

/// The classic text format of an OpenMetrics exposition without labels on counters: a
/// counter's family takes the name of its sample (`kennel_runs_total`), and the `# UNIT` and
/// `# EOF` lines, which the classic format does not have, go.
fn classic_text(open: &str) -> String {
    let counters: Vec<&str> = open
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE ")?.strip_suffix(" counter"))
        .collect();
    let mut out = String::with_capacity(open.len() + 8 * counters.len());
    for line in open.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        let meta = ["# HELP ", "# TYPE "]
            .into_iter()
            .find_map(|p| Some((p, line.strip_prefix(p)?)));
        match meta {
            Some((p, rest)) => {
                let (name, tail) = rest.split_once(' ').unwrap_or((rest, ""));
                let total = if counters.contains(&name) {
                    "_total"
                } else {
                    ""
                };
                out.push_str(&format!("{p}{name}{total} {tail}\n"));
            }
            None => {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every sample of the exposition, as `(name with labels, value)`.
    fn samples(text: &str) -> Vec<(String, f64)> {
        text.lines()
            .filter(|l| !l.starts_with('#'))
            .map(|l| {
                let (k, v) = l.rsplit_once(' ').expect("a sample line");
                (k.to_string(), v.parse().expect("a number"))
            })
            .collect()
    }

    fn value(text: &str, name: &str) -> f64 {
        samples(text)
            .into_iter()
            .find_map(|(k, v)| (k == name).then_some(v))
            .unwrap_or_else(|| panic!("no {name} in:\n{text}"))
    }

    const COUNTERS: [&str; 10] = [
        "kennel_runs_total",
        "kennel_session_execs_total",
        "kennel_timeouts_total",
        "kennel_oom_kills_total",
        "kennel_pool_hits_total",
        "kennel_pool_misses_total",
        "kennel_rejected_requests_total",
        "kennel_errors_total",
        "kennel_sessions_created_total",
        "kennel_sessions_expired_total",
    ];

    #[test]
    fn the_classic_text_has_every_name_with_its_type() {
        let text = Metrics::default().render(Format::Text);
        for name in COUNTERS {
            assert!(
                text.contains(&format!("# TYPE {name} counter\n{name} 0\n")),
                "{name} in:\n{text}"
            );
            assert!(text.contains(&format!("# HELP {name} ")), "{text}");
        }
        assert!(
            text.contains("# TYPE kennel_active_sessions gauge\nkennel_active_sessions 0\n"),
            "{text}"
        );
        assert!(text.contains("# TYPE kennel_run_duration_seconds histogram\n"));
        assert!(!text.contains("# EOF"), "{text}");
        assert!(!text.contains("_total_total"), "{text}");
        assert_eq!(samples(&text).len(), COUNTERS.len() + 1 + BUCKETS.len() + 3);
    }

    #[test]
    fn openmetrics_names_counter_families_without_total_and_ends_with_eof() {
        let m = Metrics::default();
        inc(&m.runs);
        let text = m.render(Format::OpenMetrics);
        assert!(
            text.contains("# TYPE kennel_runs counter\nkennel_runs_total 1\n"),
            "{text}"
        );
        assert!(text.ends_with("# EOF\n"), "{text}");
        // The samples are the same in both formats.
        assert_eq!(samples(&text), samples(&m.render(Format::Text)));
    }

    #[test]
    fn observations_fill_the_buckets_and_the_counters() {
        let m = Metrics::default();
        m.observe(0.003, false, false);
        m.observe(0.3, true, false);
        m.observe(60.0, false, true);
        m.active_sessions.set(2);
        let text = m.render(Format::Text);
        let d = "kennel_run_duration_seconds";
        assert_eq!(value(&text, &format!("{d}_bucket{{le=\"0.005\"}}")), 1.0);
        assert_eq!(value(&text, &format!("{d}_bucket{{le=\"0.25\"}}")), 1.0);
        assert_eq!(value(&text, &format!("{d}_bucket{{le=\"0.5\"}}")), 2.0);
        assert_eq!(value(&text, &format!("{d}_bucket{{le=\"30.0\"}}")), 2.0);
        assert_eq!(value(&text, &format!("{d}_bucket{{le=\"+Inf\"}}")), 3.0);
        assert_eq!(value(&text, &format!("{d}_count")), 3.0);
        assert!((value(&text, &format!("{d}_sum")) - 60.303).abs() < 1e-9);
        assert_eq!(value(&text, "kennel_timeouts_total"), 1.0);
        assert_eq!(value(&text, "kennel_oom_kills_total"), 1.0);
        assert_eq!(value(&text, "kennel_active_sessions"), 2.0);
    }

    #[test]
    fn openmetrics_only_for_a_scraper_that_asks_for_it() {
        let prometheus = "application/openmetrics-text;version=1.0.0;q=0.5,\
                          application/openmetrics-text;version=0.0.1;q=0.4,\
                          text/plain;version=0.0.4;q=0.3,*/*;q=0.2";
        assert_eq!(Format::negotiate(Some(prometheus)), Format::OpenMetrics);
        assert_eq!(Format::negotiate(None), Format::Text);
        assert_eq!(Format::negotiate(Some("*/*")), Format::Text);
        assert_eq!(
            Format::negotiate(Some("text/plain;version=0.0.4")),
            Format::Text
        );
        assert_eq!(
            Format::negotiate(Some("application/openmetrics-text; q=0, text/plain")),
            Format::Text
        );
    }
}
