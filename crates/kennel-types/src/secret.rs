//! Secrets: values a token keeps on the server, which the code never sees. A run or session
//! names them (`RunSpec::secrets`) and gets a placeholder in its environment; Kennel's egress
//! proxy puts the value in place of the placeholder in the request headers of TLS connections
//! it intercepts for the secret's own hosts, and nowhere else. What is asked
//! (`POST /v1/secrets`' [`SecretSpec`]) and what the API lists ([`SecretInfo`], never a value).

use serde::{Deserialize, Serialize};

use crate::error::PolicyError;
use crate::net::Rule;

/// The longest value a secret may have.
pub const MAX_SECRET_BYTES: usize = 8 << 10;
/// The most secrets one token keeps.
pub const MAX_SECRETS: usize = 64;
/// The most secrets one run or session names.
pub const MAX_NAMED: usize = 16;

/// `POST /v1/secrets`' body.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SecretSpec {
    /// The secret's name, unique among this token's secrets, and the environment variable that
    /// holds its placeholder in a sandbox: 1 to 64 of `A-Z`, `a-z`, `0-9` and `_`, not
    /// starting with a digit.
    #[schema(pattern = "^[A-Za-z_][A-Za-z0-9_]{0,63}$")]
    pub name: String,
    /// The value (1 byte to 8 KiB, no control characters): stored encrypted, never answered.
    pub value: String,
    /// The hosts it may go to, as allowlist rules (`api.example.com`, `*.example.com:443`);
    /// at least one.
    pub hosts: Vec<String>,
    /// The request header it goes in (such as `Authorization`): an HTTP token.
    pub header: String,
}

/// A value is never printed, not even in a debug line.
impl std::fmt::Debug for SecretSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SecretSpec")
            .field("name", &self.name)
            .field("value", &"<secret>")
            .field("hosts", &self.hosts)
            .field("header", &self.header)
            .finish()
    }
}

/// A secret as the API lists it: never its value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SecretInfo {
    /// The secret's name.
    pub name: String,
    /// The hosts it may go to, as allowlist rules.
    pub hosts: Vec<String>,
    /// The request header it goes in.
    pub header: String,
    /// When it was stored, in milliseconds since the Unix epoch.
    pub created_unix_ms: u64,
}

impl SecretSpec {
    /// Checks every field, naming the one that is wrong; nothing is stored for a spec that
    /// fails. Answers its hosts as rules.
    pub fn check(&self) -> Result<Vec<Rule>, PolicyError> {
        check_secret_name(&self.name)?;
        if self.value.is_empty() {
            return Err(PolicyError::request("value", "is empty"));
        }
        if self.value.len() > MAX_SECRET_BYTES {
            return Err(PolicyError::request(
                "value",
                format!(
                    "is {} bytes, past the most a secret holds ({MAX_SECRET_BYTES})",
                    self.value.len()
                ),
            ));
        }
        if self.value.chars().any(char::is_control) {
            return Err(PolicyError::request(
                "value",
                "holds a control character (a header value cannot carry one)",
            ));
        }
        if !is_token(&self.header) {
            return Err(PolicyError::request(
                "header",
                format!(
                    "{:?} is not an HTTP header name (letters, digits and !#$%&'*+-.^_`|~)",
                    self.header
                ),
            ));
        }
        if self.hosts.is_empty() {
            return Err(PolicyError::request(
                "hosts",
                "is empty: name the hosts the secret may go to",
            ));
        }
        self.hosts
            .iter()
            .map(|h| {
                Rule::parse(h).map_err(|e| PolicyError::request("hosts", format!("{h:?}: {e}")))
            })
            .collect()
    }
}

/// A secret a sandbox may use: its value (never printed), the placeholder its environment
/// holds instead, and where the value may go. Kennel's own, made by the server.
#[derive(Clone, PartialEq, Eq)]
pub struct Grant {
    /// The secret's name: the environment variable holding the placeholder.
    pub name: String,
    /// What the code sees instead of the value: random, per sandbox.
    pub placeholder: String,
    /// The value.
    pub value: String,
    /// The header it goes in.
    pub header: String,
    /// The hosts it may go to.
    pub hosts: Vec<Rule>,
}

impl std::fmt::Debug for Grant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grant")
            .field("name", &self.name)
            .field("value", &"<secret>")
            .field("hosts", &self.hosts)
            .finish_non_exhaustive()
    }
}

/// A request a secret's value went into.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Use {
    /// The secret's name.
    pub secret: String,
    /// The host the request went to.
    pub host: String,
    /// Its port.
    pub port: u16,
}

/// Checks the secrets a run names: at most [`MAX_NAMED`]. Each name is looked up by the
/// server, which answers 404 for one the caller has not (a malformed one included).
pub fn check_named(names: &[String]) -> Result<(), PolicyError> {
    if names.len() > MAX_NAMED {
        return Err(PolicyError::request(
            "secrets",
            format!(
                "names {} secrets; a sandbox gets at most {MAX_NAMED}",
                names.len()
            ),
        ));
    }
    Ok(())
}

/// Checks a secret's name, as a spec or a run names it.
pub fn check_secret_name(name: &str) -> Result<(), PolicyError> {
    let mut chars = name.chars();
    let first_ok = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
    let rest_ok = chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !first_ok || !rest_ok || name.len() > 64 {
        return Err(PolicyError::request(
            "name",
            format!(
                "{name:?} is not a secret name: 1 to 64 of A-Z, a-z, 0-9 and _, not starting \
                 with a digit"
            ),
        ));
    }
    Ok(())
}

/// Whether `s` is an HTTP token (RFC 9110's `token`): a header's name.
fn is_token(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> SecretSpec {
        SecretSpec {
            name: "OPENAI_KEY".into(),
            value: "sk-123".into(),
            hosts: vec!["api.openai.com".into()],
            header: "Authorization".into(),
        }
    }

    #[test]
    fn a_good_spec_gives_its_hosts_as_rules() {
        let rules = spec().check().unwrap();
        assert_eq!(rules.len(), 1);
        assert!(rules[0].matches("api.openai.com", 443));
        assert!(!format!("{:?}", spec()).contains("sk-123"));
    }

    #[test]
    fn each_bad_field_is_named() {
        let bad = |f: fn(&mut SecretSpec), field: &str| {
            let mut s = spec();
            f(&mut s);
            let e = s.check().unwrap_err().to_string();
            assert!(e.contains(&format!("`{field}`")), "{field}: {e}");
        };
        bad(|s| s.name = "1KEY".into(), "name");
        bad(|s| s.name = "A-B".into(), "name");
        bad(|s| s.name = String::new(), "name");
        bad(|s| s.value = String::new(), "value");
        bad(|s| s.value = "x".repeat(MAX_SECRET_BYTES + 1), "value");
        bad(|s| s.value = "a\r\nX-Evil: 1".into(), "value");
        bad(|s| s.header = "Author ization".into(), "header");
        bad(|s| s.header = String::new(), "header");
        bad(|s| s.hosts = vec![], "hosts");
        bad(|s| s.hosts = vec!["bad host".into()], "hosts");
    }
}
