//! What read_process_output answers: a background process's output as it stands, read from
//! its stream until the stream is quiet for a moment or the process exits, with the offsets
//! to continue from.

use std::time::Duration;

use serde_json::{json, Value};
use tokio::time::{timeout_at, Instant};

use kennel_sandbox::Stream;
use kennel_server::service::{ProcessEvent, ProcessStream, ServiceError};
use kennel_types::process::ProcessInfo;

/// How long the stream may be quiet before the output so far is the answer.
pub const QUIET: Duration = Duration::from_millis(500);
/// The longest one read takes, for a process that never stops writing.
pub const LONGEST: Duration = Duration::from_secs(10);
/// The most output one read returns; the offsets continue after it.
pub const MOST: usize = 256 << 10;

/// A process's output from the offsets asked for.
#[derive(Debug, Default)]
pub struct Output {
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    /// The offsets (stdout, stderr) to continue from.
    pub next: (u64, u64),
    /// Bytes asked for that the server no longer keeps (older than its last MiB).
    pub dropped: u64,
    /// The process, once it has exited and all its output was read.
    pub exit: Option<ProcessInfo>,
}

/// Reads `events` (which start at `from`) until they are quiet for `quiet`, the process
/// exits, [`MOST`] bytes came or [`LONGEST`] passed.
pub async fn read(
    mut events: ProcessStream,
    from: (u64, u64),
    quiet: Duration,
) -> Result<Output, ServiceError> {
    let mut out = Output {
        next: from,
        ..Output::default()
    };
    let end = Instant::now() + LONGEST;
    while out.stdout.len() + out.stderr.len() < MOST {
        let wait = (Instant::now() + quiet).min(end);
        let Ok(Some(event)) = timeout_at(wait, events.recv()).await else {
            break;
        };
        match event {
            ProcessEvent::Output {
                stream,
                offset,
                data,
            } => {
                let next = offset + data.len() as u64;
                if stream == Stream::Stdout {
                    out.stdout.extend_from_slice(&data);
                    out.next.0 = next;
                } else {
                    out.stderr.extend_from_slice(&data);
                    out.next.1 = next;
                }
            }
            ProcessEvent::Dropped { bytes, .. } => out.dropped += bytes,
            ProcessEvent::Exit(info) => {
                out.exit = Some(*info);
                break;
            }
            ProcessEvent::Failed(e) => return Err(e),
        }
    }
    Ok(out)
}

/// How a process ended, in words.
fn ended(info: &ProcessInfo) -> String {
    match (info.exit_code, info.signal) {
        _ if info.timed_out => "timed out (killed by its timeout)".into(),
        (Some(code), _) => format!("exited with code {code}"),
        (None, Some(signal)) => format!("killed by signal {signal}"),
        (None, None) => "exited".into(),
    }
}

/// The answer: text for a model and the structured result.
pub fn render(pid: u32, out: &Output) -> (String, Value) {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let state = out
        .exit
        .as_ref()
        .map_or_else(|| "still running".to_string(), ended);
    let mut text = format!("process {pid}: {state}\n");
    if out.dropped > 0 {
        text += &format!("({} older bytes are no longer kept)\n", out.dropped);
    }
    for (name, s) in [("stdout", &stdout), ("stderr", &stderr)] {
        if !s.is_empty() {
            text += &format!("--- {name} ---\n{s}");
            if !s.ends_with('\n') {
                text.push('\n');
            }
        }
    }
    if out.exit.is_none() {
        text += &format!(
            "continue with stdout_offset={} stderr_offset={}",
            out.next.0, out.next.1
        );
    }
    let data = json!({
        "pid": pid,
        "exited": out.exit.is_some(),
        "exit_code": out.exit.as_ref().and_then(|i| i.exit_code),
        "signal": out.exit.as_ref().and_then(|i| i.signal),
        "timed_out": out.exit.as_ref().is_some_and(|i| i.timed_out),
        "stdout": stdout,
        "stderr": stderr,
        "stdout_offset": out.next.0,
        "stderr_offset": out.next.1,
        "dropped_bytes": out.dropped,
    });
    (text.trim_end().to_string(), data)
}

/// A process as one line: its pid, what it runs and whether it still does.
pub fn line(info: &ProcessInfo) -> String {
    let state = if info.ended_at_unix_ms.is_none() {
        "running".to_string()
    } else {
        ended(info)
    };
    format!("{}  {}  {}", info.pid, state, info.argv.join(" "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::sync::mpsc;

    fn info(exit_code: Option<i32>) -> ProcessInfo {
        serde_json::from_value(json!({"pid": 7, "argv": ["sh"], "state": "exited",
            "exit_code": exit_code, "signal": null, "timed_out": false,
            "started_at_unix_ms": 1, "ended_at_unix_ms": 2, "stdin": false,
            "stdout_bytes": 3, "stderr_bytes": 0, "usage": null}))
        .unwrap()
    }

    #[tokio::test]
    async fn output_is_read_to_the_exit_with_the_offsets_to_continue_from() {
        let (tx, rx) = mpsc::channel(8);
        let out = |offset, data: &str| ProcessEvent::Output {
            stream: Stream::Stdout,
            offset,
            data: data.into(),
        };
        tx.send(out(4, "ab")).await.unwrap();
        tx.send(out(6, "c\n")).await.unwrap();
        tx.send(ProcessEvent::Exit(Box::new(info(Some(3)))))
            .await
            .unwrap();
        let read = read(rx, (4, 1), QUIET).await.unwrap();
        assert_eq!((read.stdout.as_slice(), read.next), (&b"abc\n"[..], (8, 1)));
        let (text, data) = render(7, &read);
        assert_eq!(text, "process 7: exited with code 3\n--- stdout ---\nabc");
        assert_eq!(data["exit_code"], 3);
        assert_eq!(data["stdout_offset"], 8);
    }

    #[tokio::test]
    async fn a_quiet_stream_answers_what_came_so_far() {
        let (tx, rx) = mpsc::channel(8);
        tx.send(ProcessEvent::Dropped {
            stream: Stream::Stderr,
            bytes: 5,
        })
        .await
        .unwrap();
        let read = read(rx, (0, 0), Duration::from_millis(20)).await.unwrap();
        drop(tx);
        assert!(read.exit.is_none());
        let (text, data) = render(9, &read);
        assert!(
            text.ends_with("continue with stdout_offset=0 stderr_offset=0"),
            "{text}"
        );
        assert_eq!(data["exited"], false);
        assert_eq!(data["dropped_bytes"], 5);
    }
}
