//! Images: named, immutable root filesystems that every tier can run on. The spec a user writes
//! (`images/*.toml`) and the record Kennel keeps beside each built image.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::error::PolicyError;

/// The longest image name.
pub const MAX_NAME: usize = 64;

/// A string refused as an image name: names are file names in the store.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error(
    "{name:?} is not an image name: use a lower-case letter or digit, then up to {} of a-z, \
     0-9, '.', '_' and '-'",
    MAX_NAME - 1
)]
pub struct BadImageName {
    /// The name as it was given.
    pub name: String,
}

/// An image name: a lower-case letter or digit, then up to 63 of `a-z 0-9 . _ -`. Names are
/// file names in the store, so nothing else is allowed.
pub fn check_name(name: &str) -> Result<(), BadImageName> {
    let ok_first = name
        .bytes()
        .next()
        .is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
    let ok_rest = name
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b));
    if ok_first && ok_rest && name.len() <= MAX_NAME {
        Ok(())
    } else {
        Err(BadImageName {
            name: name.to_string(),
        })
    }
}

/// Debian's bootstrap variants, as mmdebstrap names them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Variant {
    /// Essential packages and apt (mmdebstrap's `minbase` without apt is `essential`).
    #[default]
    Apt,
    /// Essential and `Priority: required` packages, and apt.
    Minbase,
    /// Only the `Essential: yes` packages.
    Essential,
    /// The `Priority: required` packages.
    Required,
    /// Required and `Priority: important` packages.
    Important,
    /// Important and `Priority: standard` packages.
    Standard,
}

impl Variant {
    /// The variant's name, as mmdebstrap and a spec write it.
    pub fn name(self) -> &'static str {
        match self {
            Variant::Apt => "apt",
            Variant::Minbase => "minbase",
            Variant::Essential => "essential",
            Variant::Required => "required",
            Variant::Important => "important",
            Variant::Standard => "standard",
        }
    }
}

/// The Debian system an image starts from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Base {
    /// A Debian suite the host's apt sources serve, such as `bookworm`.
    pub suite: String,
    /// Which of the suite's packages the bootstrap installs; `apt` by default.
    #[serde(default)]
    pub variant: Variant,
}

/// A file copied into the image: `src` is relative to the spec file's directory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileCopy {
    /// The file on the host, relative to the spec's directory.
    pub src: PathBuf,
    /// An absolute path in the image.
    pub dest: String,
    /// Permission bits; the source file's when unset.
    pub mode: Option<u32>,
}

/// What a user writes to build an image (`kennel image build NAME -f spec.toml`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ImageSpec {
    /// The Debian system the image starts from.
    pub base: Base,
    /// Debian packages, by name (optionally `name=version`).
    #[serde(default)]
    pub apt: Vec<String>,
    /// pip requirements (`numpy`, `pandas==2.1.4`, `requests>=2`), installed into the image's
    /// `/usr/local`; the versions pip chose are recorded in the image's record.
    #[serde(default)]
    pub pip: Vec<String>,
    /// Files copied into the image after the packages are installed.
    #[serde(default)]
    pub files: Vec<FileCopy>,
    /// Environment variables every sandbox of the image gets (a run's own `env` wins).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Python modules that pooled sandboxes of the image import before a run is handed to them.
    #[serde(default)]
    pub preload: Vec<String>,
}

/// Paths an image file may not be copied to: Kennel mounts its own there.
const PROVIDED: &[&str] = &["/proc", "/dev", "/sys", "/tmp", "/workspace", "/run"];

impl ImageSpec {
    /// Parses and checks a spec; unknown keys are errors.
    pub fn from_toml(text: &str) -> Result<ImageSpec, PolicyError> {
        let spec: ImageSpec =
            toml::from_str(text).map_err(|e| PolicyError::Parse(e.to_string()))?;
        spec.validate()?;
        Ok(spec)
    }

    /// Checks every value once: names that cannot smuggle options into apt or pip, module
    /// names Python can import, destinations inside the image.
    pub fn validate(&self) -> Result<(), PolicyError> {
        let bad = |field: &'static str, why: String| PolicyError::Invalid { field, why };
        if !word(&self.base.suite, |b| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-'
        }) {
            return Err(bad(
                "base.suite",
                format!("{:?} is not a suite name", self.base.suite),
            ));
        }
        for p in &self.apt {
            let (name, version) = p.split_once('=').unwrap_or((p, ""));
            let name_ok = word(name, |b| {
                b.is_ascii_lowercase() || b.is_ascii_digit() || b"+-.".contains(&b)
            }) && !name.starts_with(['-', '.', '+']);
            let version_ok = p.len() == name.len()
                || word(version, |b| {
                    b.is_ascii_alphanumeric() || b".+-~:".contains(&b)
                });
            if !(name_ok && version_ok) {
                return Err(bad("apt", format!("{p:?} is not a Debian package name")));
            }
        }
        for r in &self.pip {
            let first = r.bytes().next();
            // A requirement starts with a project name; `-` would be an option, and markers,
            // comments and URLs have no place in a spec.
            if !first.is_some_and(|b| b.is_ascii_alphanumeric())
                || !r.bytes().all(|b| b.is_ascii_graphic())
                || r.contains(['#', ';', '@', '/'])
            {
                return Err(bad(
                    "pip",
                    format!(
                        "{r:?} is not a requirement: write a project name with an optional \
                         version (`pandas==2.1.4`); pip options are not taken"
                    ),
                ));
            }
        }
        for m in &self.preload {
            let ident = |s: &str| {
                s.bytes()
                    .next()
                    .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
                    && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
            };
            if !m.split('.').all(ident) {
                return Err(bad("preload", format!("{m:?} is not a Python module name")));
            }
        }
        for f in &self.files {
            let dest_ok = f.dest.starts_with('/')
                && !f.dest.contains('\0')
                && !f.dest.split('/').any(|c| c == ".." || c == ".")
                && !PROVIDED
                    .iter()
                    .any(|p| f.dest == *p || f.dest.starts_with(&format!("{p}/")));
            if !dest_ok {
                return Err(bad(
                    "files.dest",
                    format!(
                        "{:?} must be an absolute path in the image, without `..`, outside \
                         {}",
                        f.dest,
                        PROVIDED.join(", ")
                    ),
                ));
            }
            if f.mode.is_some_and(|m| m > 0o7777) {
                let mode = f.mode.unwrap_or_default();
                return Err(bad(
                    "files.mode",
                    format!("{mode:o} is not a permission mode"),
                ));
            }
        }
        for k in self.env.keys() {
            if k.is_empty() || k.contains(['=', '\0']) {
                return Err(bad("env", format!("{k:?} is not a variable name")));
            }
        }
        if self.env.values().any(|v| v.contains('\0')) {
            return Err(bad("env", "a value contains a NUL byte".into()));
        }
        Ok(())
    }
}

fn word(s: &str, ok: impl Fn(u8) -> bool) -> bool {
    !s.is_empty() && s.len() <= 128 && s.bytes().all(ok)
}

/// Where an image came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ImageSource {
    /// Built from a spec: Debian's suite and the packages asked for.
    Spec {
        /// The Debian suite.
        suite: String,
        /// The bootstrap variant.
        variant: String,
        /// The Debian packages the spec asked for.
        apt: Vec<String>,
        /// The pip requirements the spec asked for.
        pip: Vec<String>,
    },
    /// Imported from an OCI image layout or a `docker save` tarball.
    Oci {
        /// The layout's directory or the tarball, as given to the import.
        path: String,
        /// How many layers were applied.
        layers: usize,
    },
    /// Copied from a directory.
    Dir {
        /// The directory, as given to the import.
        path: String,
    },
}

/// What Kennel records of a built image, beside its root (`kennel image inspect`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ImageRecord {
    /// The content digest of the root (`sha256:...`): paths, types, modes, owners, contents.
    pub digest: String,
    /// Where the image came from.
    pub source: ImageSource,
    /// When the image was built, in seconds since the Unix epoch.
    pub created_unix: u64,
    /// How many files the root holds.
    pub files: u64,
    /// How many bytes the root's files hold.
    pub bytes: u64,
    /// Environment variables every sandbox of the image gets.
    pub env: BTreeMap<String, String>,
    /// Python modules that pooled sandboxes of the image import before a run.
    pub preload: Vec<String>,
    /// The Python distributions installed, as `pip freeze` wrote them after the build.
    #[serde(default)]
    pub pip_frozen: Vec<String>,
    /// The OCI config's command, for imported images.
    #[serde(default)]
    pub cmd: Vec<String>,
}

/// An image named by a result: which one, exactly.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ImageInfo {
    /// The image's name in the store, as the request gave it.
    pub name: String,
    /// The content digest of its root (`sha256:...`), which names its exact contents.
    pub digest: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    const SPEC: &str = r#"
        apt = ["python3", "python3-pip", "libgomp1=12.2.0-14"]
        pip = ["numpy==1.26.4", "requests>=2"]
        preload = ["numpy", "matplotlib.pyplot"]
        env = { MPLBACKEND = "Agg" }
        [base]
        suite = "bookworm"
        [[files]]
        src = "matplotlibrc"
        dest = "/etc/matplotlibrc"
    "#;

    #[test]
    fn a_spec_parses_and_checks() {
        let spec = ImageSpec::from_toml(SPEC).unwrap();
        assert_eq!(spec.base.variant, Variant::Apt);
        assert_eq!(spec.preload.len(), 2);
    }

    #[test]
    fn bad_specs_name_their_field() {
        for (text, field) in [
            (
                "[base]\nsuite = \"bookworm\"\nfrobnicate = 1\n",
                "unknown field",
            ),
            (
                "apt = [\"-o=APT::Foo\"]\n[base]\nsuite = \"bookworm\"\n",
                "apt",
            ),
            (
                "pip = [\"--index-url=http://evil\"]\n[base]\nsuite = \"bookworm\"\n",
                "pip",
            ),
            (
                "pip = [\"numpy; os_name\"]\n[base]\nsuite = \"bookworm\"\n",
                "pip",
            ),
            (
                "preload = [\"os; import x\"]\n[base]\nsuite = \"bookworm\"\n",
                "preload",
            ),
            ("[base]\nsuite = \"../x\"\n", "base.suite"),
            (
                "[base]\nsuite = \"bookworm\"\n[[files]]\nsrc = \"a\"\ndest = \"/tmp/a\"\n",
                "files.dest",
            ),
            (
                "[base]\nsuite = \"bookworm\"\n[[files]]\nsrc = \"a\"\ndest = \"/etc/../x\"\n",
                "files.dest",
            ),
            (
                "[base]\nsuite = \"bookworm\"\nvariant = \"huge\"\n",
                "variant",
            ),
        ] {
            let err = ImageSpec::from_toml(text).unwrap_err().to_string();
            assert!(err.contains(field), "{text}: {err}");
        }
    }

    #[test]
    fn the_shipped_spec_parses() {
        let spec = ImageSpec::from_toml(include_str!("../../../images/python-data.toml")).unwrap();
        assert!(spec.pip.iter().any(|p| p.starts_with("pandas==")));
        assert!(spec.preload.contains(&"matplotlib.pyplot".to_string()));
    }

    #[test]
    fn names_are_file_names() {
        for ok in ["python-data", "a", "x.1_2-3"] {
            check_name(ok).unwrap();
        }
        for bad in ["", "-x", ".x", "Py", "a/b", "..", "a b", &"a".repeat(65)] {
            assert!(check_name(bad).is_err(), "{bad}");
        }
        let err = check_name("Py").unwrap_err().to_string();
        assert!(
            err.starts_with("\"Py\" is not an image name: use a lower-case"),
            "{err}"
        );
        assert!(err.contains("up to 63 of"), "{err}");
    }
}
