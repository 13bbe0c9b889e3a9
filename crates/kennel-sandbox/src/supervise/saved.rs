//! What every tier's saver (a run's `Started::saver`, issue 31's `keep: "saved"`) shares: an
//! empty directory to save into, files written synced, and the inputs a state was saved
//! under, which a restore compares with its own.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::channel::INPUTS_FILE;
use crate::error::Error;

/// What a saved sandbox can be restored with only, by name (see [`super::io::Saved::inputs`]).
pub(crate) type Inputs = BTreeMap<String, String>;

/// The answer of the tier's side that saves (the microVM's relay, the OCI launcher) to one
/// save: the files it wrote, or why it could not.
pub(crate) type Answer = Result<Vec<String>, String>;

/// `dir` as an absolute path (the relay's working directory is not ours to rely on), when it
/// is an existing empty directory.
pub(crate) fn empty_dir(dir: &Path) -> Result<PathBuf, Error> {
    let bad = |why: String| Error::NotSaved(format!("{}: {why}", dir.display()));
    let abs = std::fs::canonicalize(dir).map_err(|e| bad(e.to_string()))?;
    let mut entries = std::fs::read_dir(&abs).map_err(|e| bad(e.to_string()))?;
    if entries.next().is_some() {
        return Err(bad("not an empty directory".into()));
    }
    Ok(abs)
}

/// Writes `data` to a new file at `path`, synced.
pub(crate) fn write_file_synced(path: &Path, data: &[u8]) -> std::io::Result<()> {
    let mut file = std::fs::File::create_new(path)?;
    file.write_all(data)?;
    file.sync_all()
}

/// Writes `inputs` as JSON to `path`, synced.
pub(crate) fn write_synced(path: &Path, inputs: &Inputs) -> std::io::Result<()> {
    let text = serde_json::to_vec_pretty(inputs).map_err(std::io::Error::other)?;
    write_file_synced(path, &text)
}

/// The inputs saved in `dir`, or `refused` with why they cannot be read.
pub(crate) fn saved_inputs(dir: &Path, refused: impl Fn(String) -> Error) -> Result<Inputs, Error> {
    let text = std::fs::read(dir.join(INPUTS_FILE))
        .map_err(|e| refused(format!("reading {INPUTS_FILE}: {e}")))?;
    serde_json::from_slice(&text).map_err(|e| refused(format!("{INPUTS_FILE} does not parse: {e}")))
}

/// The names whose values differ between `saved` and `now` (one side lacking a name is a
/// difference), but for `ignored`.
pub(crate) fn differing<'a>(saved: &'a Inputs, now: &'a Inputs, ignored: &[&str]) -> Vec<&'a str> {
    let keys: BTreeSet<&String> = saved.keys().chain(now.keys()).collect();
    keys.into_iter()
        .filter(|k| !ignored.contains(&k.as_str()) && saved.get(*k) != now.get(*k))
        .map(String::as_str)
        .collect()
}
