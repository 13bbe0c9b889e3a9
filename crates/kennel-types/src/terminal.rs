//! A session's terminals: a `bash --login` on a pty of the sandbox, reached over a WebSocket
//! (`GET /v1/sessions/{id}/terminals/{tid}`). A background process started with `tty` runs on
//! a pty too, and is reached the same way.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::error::PolicyError;

/// The most columns or rows a terminal may have: far beyond any screen, and small enough
/// that nothing sized by them grows large.
pub const MAX_TERMINAL_SIDE: u16 = 1000;

/// A terminal's size, in character cells.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TerminalSize {
    /// Columns, 1 to 1000.
    pub cols: u16,
    /// Rows, 1 to 1000.
    pub rows: u16,
}

impl Default for TerminalSize {
    /// 80×24, a terminal's size since the VT100.
    fn default() -> TerminalSize {
        TerminalSize { cols: 80, rows: 24 }
    }
}

impl TerminalSize {
    /// The size, refused when a side is 0 or above [`MAX_TERMINAL_SIDE`].
    pub fn check(self) -> Result<TerminalSize, PolicyError> {
        for (field, side) in [("cols", self.cols), ("rows", self.rows)] {
            if side == 0 || side > MAX_TERMINAL_SIDE {
                return Err(PolicyError::request(
                    field,
                    format!("is {side}: a terminal has 1 to {MAX_TERMINAL_SIDE}"),
                ));
            }
        }
        Ok(self)
    }

    /// The size that `cols` and `rows` give, each defaulting to 80×24's, checked.
    pub fn from_parts(cols: Option<u16>, rows: Option<u16>) -> Result<TerminalSize, PolicyError> {
        let default = TerminalSize::default();
        TerminalSize {
            cols: cols.unwrap_or(default.cols),
            rows: rows.unwrap_or(default.rows),
        }
        .check()
    }
}

/// Opens a terminal in a session: `bash --login` in `cwd` with `TERM=xterm-256color`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TerminalSpec {
    /// Columns (default 80).
    pub cols: Option<u16>,
    /// Rows (default 24).
    pub rows: Option<u16>,
    /// Its working directory (default `/workspace`).
    pub cwd: Option<String>,
    /// Environment variables beyond the sandbox's own.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Who its shell runs as: `default` or `user` (uid 1000, `HOME=/workspace`), a 400 where
    /// the sandbox cannot give uid 1000, as for an exec.
    #[serde(default)]
    pub user: crate::api::User,
}

/// The shell a terminal runs.
pub const TERMINAL_SHELL: [&str; 2] = ["/bin/bash", "--login"];

/// The `TERM` a terminal's shell gets: what xterm.js and most emulators speak.
pub const TERMINAL_TYPE: &str = "xterm-256color";

impl TerminalSpec {
    /// Its size, checked.
    pub fn size(&self) -> Result<TerminalSize, PolicyError> {
        TerminalSize::from_parts(self.cols, self.rows)
    }

    /// The environment of its shell: `TERM`, then the caller's variables.
    pub fn environment(&self) -> Result<BTreeMap<String, String>, PolicyError> {
        if self
            .env
            .iter()
            .any(|(k, v)| k.contains('\0') || v.contains('\0'))
        {
            return Err(PolicyError::request(
                "env",
                "contains a NUL byte, which an environment cannot hold",
            ));
        }
        let mut env = BTreeMap::from([("TERM".to_string(), TERMINAL_TYPE.to_string())]);
        env.extend(self.env.clone());
        Ok(env)
    }
}

/// A text frame a client sends on a terminal's WebSocket (binary frames are keystrokes).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum TerminalControl {
    /// Resizes the terminal; its foreground programs get SIGWINCH.
    Resize {
        /// Columns, 1 to 1000.
        cols: u16,
        /// Rows, 1 to 1000.
        rows: u16,
    },
    /// Text typed, for clients that send strings (xterm.js's `onData`).
    Input {
        /// The text, sent to the pty as UTF-8.
        data: String,
    },
}

/// A text frame the server sends on a terminal's WebSocket (binary frames are its output).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum TerminalNotice {
    /// The process on the pty ended, and all its output was sent; the server closes the
    /// connection after this.
    Exit {
        /// Its exit status, when it exited on its own.
        exit_code: Option<i32>,
        /// The signal that ended it, if one did.
        signal: Option<i32>,
    },
    /// Output older than the last MiB kept was not sent to a client that read too slowly.
    Dropped {
        /// How many bytes.
        bytes: u64,
    },
    /// A frame was refused (`status` 400: a malformed control, a size out of bounds) or the
    /// terminal failed (410: its session ended); the connection stays open after a 4xx.
    Error {
        /// The HTTP status the refusal would have had.
        status: u16,
        /// What was wrong, and what to do.
        message: String,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_size_is_one_to_a_thousand_each_way() {
        assert_eq!(
            TerminalSize::from_parts(None, None).unwrap(),
            TerminalSize { cols: 80, rows: 24 }
        );
        for (cols, rows, bad) in [
            (0, 24, Some("cols")),
            (80, 0, Some("rows")),
            (1001, 24, Some("cols")),
            (1000, 1000, None),
            (1, 1, None),
        ] {
            let checked = TerminalSize { cols, rows }.check();
            match bad {
                Some(field) => assert!(
                    checked
                        .unwrap_err()
                        .to_string()
                        .contains(&format!("`{field}`")),
                    "{cols}x{rows}"
                ),
                None => assert!(checked.is_ok(), "{cols}x{rows}"),
            }
        }
    }

    #[test]
    fn control_frames_are_tagged_and_strict() {
        let resize: TerminalControl =
            serde_json::from_str(r#"{"type":"resize","cols":100,"rows":30}"#).unwrap();
        assert_eq!(
            resize,
            TerminalControl::Resize {
                cols: 100,
                rows: 30
            }
        );
        for bad in [
            r#"{"type":"resize","cols":100}"#,
            r#"{"type":"resize","cols":1,"rows":1,"x":1}"#,
            r#"{"type":"bell"}"#,
            r#"{"cols":1,"rows":1}"#,
        ] {
            assert!(
                serde_json::from_str::<TerminalControl>(bad).is_err(),
                "{bad}"
            );
        }
    }

    #[test]
    fn a_terminal_speaks_xterm_unless_told_otherwise() {
        let spec = TerminalSpec::default();
        assert_eq!(spec.environment().unwrap()["TERM"], "xterm-256color");
        let mine = TerminalSpec {
            env: BTreeMap::from([("TERM".into(), "vt100".into())]),
            ..TerminalSpec::default()
        };
        assert_eq!(mine.environment().unwrap()["TERM"], "vt100");
    }
}
