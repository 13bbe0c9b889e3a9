//! What the command itself prints. Every line goes through here, never `println!` (the crate
//! denies `clippy::print_stdout` and `print_stderr`): `println!` panics when its reader has
//! gone away (`kennel openapi | head`), which ends the command with status 101 and a panic
//! message.
//!
//! A closed stdout ends the command quietly, with the status it would have had: what it did
//! is done (an image built, a run ended), and the reader chose to stop reading, as with
//! ripgrep. A closed stderr loses the note and nothing else.

use std::io::Write;

/// stdout's reader has gone away: the command stops writing and ends quietly.
#[derive(Debug, thiserror::Error)]
#[error("stdout is closed")]
pub struct Closed;

/// Writes `args` to stdout at once; a reader that has gone away is [`Closed`].
pub fn stdout(args: std::fmt::Arguments) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    out.write_fmt(args)
        .and_then(|()| out.flush())
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::BrokenPipe => anyhow::Error::new(Closed),
            _ => anyhow::Error::new(e).context("writing to stdout"),
        })
}

/// Writes `args` to stderr, if anyone reads it.
pub fn stderr(args: std::fmt::Arguments) {
    let _ = std::io::stderr().lock().write_fmt(args);
}

/// Whether `e` is stdout's reader going away (see [`Closed`]).
pub fn closed(e: &anyhow::Error) -> bool {
    e.downcast_ref::<Closed>().is_some()
}

/// `println!` to stdout that returns an error instead of panicking (see [`stdout`]).
macro_rules! outln {
    ($($arg:tt)*) => {
        $crate::out::stdout(format_args!("{}\n", format_args!($($arg)*)))
    };
}

/// `print!` to stdout that returns an error instead of panicking (see [`stdout`]).
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::out::stdout(format_args!($($arg)*))
    };
}

/// `eprintln!` that never panics (see [`stderr`]).
macro_rules! errln {
    ($($arg:tt)*) => {
        $crate::out::stderr(format_args!("{}\n", format_args!($($arg)*)))
    };
}

pub(crate) use {errln, out, outln};
