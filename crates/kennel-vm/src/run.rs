//! Running the host's tools (apt, dpkg, kmod, the unpacked QEMU): output captured, a missing
//! tool named with its package, a failure with the end of what it said.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::PrepareError;

/// How many of a failed tool's last stderr lines an error quotes.
const TAIL_LINES: usize = 12;

/// Where `name` is: on `PATH`, else in the sbin directories a non-root `PATH` often lacks
/// (Debian puts depmod and modprobe there).
pub(crate) fn tool(name: &str) -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin"].map(PathBuf::from))
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| PathBuf::from(name))
}

/// A command for `name` (found by [`tool`]) in the C locale: its output is parsed, so it must
/// not be translated.
pub(crate) fn command(name: &str) -> Command {
    let mut cmd = Command::new(tool(name));
    cmd.env("LC_ALL", "C");
    cmd
}

/// The Debian package that ships a host tool, for the hint when it is missing.
fn package_of(program: &str) -> Option<&'static str> {
    match program {
        "apt-get" | "apt-cache" => Some("apt"),
        "dpkg" => Some("dpkg"),
        "depmod" | "modprobe" => Some("kmod"),
        _ => None,
    }
}

/// Runs `cmd` to the end; a status other than 0 is an error of `step`, with `hint`.
pub(crate) fn run(
    step: &'static str,
    cmd: &mut Command,
    hint: &str,
) -> Result<Output, PrepareError> {
    let program = Path::new(cmd.get_program())
        .file_name()
        .unwrap_or(OsStr::new("?"))
        .to_string_lossy()
        .into_owned();
    let out = cmd.output().map_err(|e| match package_of(&program) {
        Some(package) if e.kind() == std::io::ErrorKind::NotFound => PrepareError::MissingTool {
            package,
            tool: program.clone(),
        },
        _ => PrepareError::Command {
            step,
            command: describe(cmd),
            detail: format!("cannot start it: {e}"),
            hint: hint.to_string(),
        },
    })?;
    if !out.status.success() {
        return Err(PrepareError::Command {
            step,
            command: describe(cmd),
            detail: format!("{}; it said:\n{}", out.status, tail(&out.stderr)),
            hint: hint.to_string(),
        });
    }
    Ok(out)
}

/// The command line, shortened: a download names twenty packages.
fn describe(cmd: &Command) -> String {
    let mut text = cmd.get_program().to_string_lossy().into_owned();
    for a in cmd.get_args() {
        text.push(' ');
        text.push_str(&a.to_string_lossy());
    }
    if text.chars().count() > 200 {
        text = text.chars().take(200).collect::<String>() + " ...";
    }
    text
}

/// The last lines of a tool's stderr, where its reason is.
fn tail(stderr: &[u8]) -> String {
    let text = String::from_utf8_lossy(stderr);
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    let start = lines.len().saturating_sub(TAIL_LINES);
    match lines.get(start..) {
        Some([]) | None => "(nothing on stderr)".into(),
        Some(last) => last.join("\n"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_tool_names_its_package() {
        let err = run(
            "testing",
            Command::new("/nonexistent/depmod").arg("-V"),
            "none",
        )
        .unwrap_err();
        assert!(matches!(err, PrepareError::MissingTool { .. }), "{err}");
    }

    #[test]
    fn a_failure_quotes_the_end_of_stderr() {
        let mut cmd = Command::new("/bin/sh");
        cmd.args([
            "-c",
            "for i in $(seq 1 30); do echo line$i >&2; done; exit 3",
        ]);
        let err = run("testing", &mut cmd, "do something")
            .unwrap_err()
            .to_string();
        assert!(err.contains("line30") && !err.contains("line2\n"), "{err}");
        assert!(
            err.contains("exit status: 3") && err.contains("hint: do something"),
            "{err}"
        );
    }
}
