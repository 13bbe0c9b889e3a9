//! Execs: running code or a command in the agent, and acting on the exec that runs.

use std::time::Duration;

use kennel_sandbox::Stream;
use kennel_types::api::{FigureFormat, Language, RichOutput};
use kennel_types::user::User;

use super::error::{unexpected, AgentError};
use super::protocol::{encode, Code, Event, Progress, Ran, Request};
use super::sandbox::AgentSandbox;

/// How long past an exec's own timeout the agent may take to answer before the sandbox is
/// killed as unresponsive.
const ANSWER_GRACE: Duration = Duration::from_secs(5);

/// What [`AgentSandbox::control`] does to a running exec.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Control {
    Interrupt,
    Cancel,
}

/// One exec: what to run, and how.
#[derive(Debug, Clone, Copy)]
pub struct Exec<'a> {
    pub language: Language,
    pub code: &'a str,
    pub stdin: Option<&'a str>,
    pub timeout: Duration,
    pub output_limit: u64,
    /// A pooled one-shot run: python looks to the code like `python3 -c`, and the sandbox
    /// ends right after.
    pub one_shot: bool,
    /// A one-shot python run with rich results, as a session exec has them.
    pub rich: bool,
    /// Python: how figures are rendered (the agent's default, png, when None).
    pub figure_formats: Option<&'a [FigureFormat]>,
    /// Its reserved id ([`AgentSandbox::reserve`]), if it may be cancelled by it.
    pub id: Option<u64>,
    /// Who runs it, already checked against the sandbox ([`User::check`]).
    pub user: User,
}

impl AgentSandbox {
    /// the code can write to the channel they come by.
    pub async fn exec(
        &self,
        exec: Exec<'_>,
        mut on_progress: impl FnMut(Progress<'_>),
    ) -> Result<Ran, AgentError> {
        if exec.language == Language::Python && (exec.rich || !exec.one_shot) {
            self.define().await?;
        }
        let request = Request::Exec {
            code: Code::new(exec.language, exec.code),
            timeout_ms: kennel_types::millis(exec.timeout),
            one_shot: exec.one_shot,
            rich: exec.one_shot && exec.rich,
            output_limit: exec.output_limit,
            stdin_b64: exec.stdin.map(|s| encode(s.as_bytes())),
            figure_formats: exec.figure_formats,
            user: exec.user,
            reseed: self.reseed.swap(false, std::sync::atomic::Ordering::SeqCst),
        };
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let (mut results, mut budget, mut dropped) = (Vec::new(), exec.output_limit, false);
        let last = self
            .call_as(
                exec.id,
                &request,
                exec.timeout + ANSWER_GRACE,
                |progress| match progress {
                    Progress::Output(stream, data) => {
                        on_progress(progress);
                        match stream {
                            Stream::Stdout => out.extend_from_slice(data),
                            Stream::Stderr => err.extend_from_slice(data),
                        }
                    }
                    Progress::Rich(output) => {
                        let size = u64::try_from(output.size()).unwrap_or(u64::MAX);
                        if results.len() < RichOutput::MAX && size <= budget {
                            budget -= size;
                            results.push(output.clone());
                            on_progress(progress);
                        } else {
                            dropped = true;
                        }
                    }
                },
            )
            .await?;
        let Event::Result(mut result) = last else {
            return Err(unexpected(last));
        };
        result.exec.outcome.stdout = String::from_utf8_lossy(&out).into_owned();
        result.exec.outcome.stderr = String::from_utf8_lossy(&err).into_owned();
        result.exec.results = results;
        result.exec.results_truncated |= dropped;
        Ok(*result)
    }

    /// Acts on the exec running now, without waiting for it (nor for an answer: the exec's
    /// caller skips it): `Interrupt` is Ctrl-C, `Cancel` ends it as its timeout would. With
    /// no exec running, it does nothing.
    pub fn control(&self, control: Control) {
        let request = match control {
            Control::Interrupt => Request::Interrupt { target: None },
            Control::Cancel => Request::Cancel { target: None },
        };
        let _ = self.requests.send(&request, None);
    }

    /// An id for an exec to come ([`Exec::id`]), by which [`AgentSandbox::cancel`] names it.
    pub fn reserve(&self) -> u64 {
        self.requests.reserve()
    }

    /// Cancels the exec of a reserved id, whether it was sent yet or not, and no other.
    pub fn cancel(&self, id: u64) {
        self.requests.cancel(id);
    }
}
