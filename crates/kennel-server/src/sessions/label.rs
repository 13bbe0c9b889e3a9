//! What a session is called (its name, unique per token), its labels, and the shape of its
//! sandbox that `get_or_create` compares.

use std::collections::BTreeMap;

use kennel_types::policy::{Limits, NetMode, Network, Platform, Policy, Runtime, Tier};

/// What a session is called and labelled with, and what its sandbox was asked to be.
#[derive(Debug, Clone)]
pub struct Label {
    /// Unique among its token's open sessions.
    pub name: Option<String>,
    pub metadata: BTreeMap<String, String>,
    /// What `get_or_create` compares (for a named session; kept for any).
    pub shape: Shape,
}

/// The fields of a session's policy that `get_or_create` compares: what its sandbox is, as
/// the server resolved the request (defaults and the token's rules applied), so that two
/// requests that differ only in spelling a default out match.
#[derive(Debug, Clone, PartialEq)]
pub struct Shape {
    tier: Tier,
    /// Only for the oci tier: the others have none.
    runtime: Option<Runtime>,
    platform: Option<Platform>,
    image: Option<String>,
    limits: Limits,
    network: Network,
    env: BTreeMap<String, String>,
}

impl Shape {
    /// The tier of the session's sandbox.
    pub fn tier(&self) -> Tier {
        self.tier
    }

    /// Its OCI runtime, in the oci tier.
    pub fn runtime(&self) -> Option<Runtime> {
        self.runtime
    }

    /// Its network mode.
    pub fn network_mode(&self) -> NetMode {
        self.network.mode
    }

    pub fn of(policy: &Policy) -> Shape {
        Shape {
            tier: policy.tier,
            runtime: (policy.tier == Tier::Oci).then_some(policy.oci.runtime),
            platform: policy.oci.platform,
            image: policy.filesystem.image.clone(),
            limits: policy.limits.clone(),
            network: policy.network.clone(),
            env: policy.env.clone(),
        }
    }

    /// The fields in which `other` differs from this, as a request names them
    /// (`limits.memory`, `network`); none when they match. Env values are never shown.
    pub fn differences(&self, other: &Shape) -> Vec<String> {
        let mut fields: Vec<String> = [
            ("tier", self.tier != other.tier),
            ("runtime", self.runtime != other.runtime),
            ("platform", self.platform != other.platform),
            ("image", self.image != other.image),
        ]
        .into_iter()
        .filter(|(_, differ)| *differ)
        .map(|(field, _)| field.to_string())
        .collect();
        fields.extend(limit_differences(&self.limits, &other.limits));
        if self.network != other.network {
            fields.push("network".into());
        }
        if self.env != other.env {
            fields.push("env".into());
        }
        fields
    }
}

/// The limits that differ, each as `limits.<name>`: read through their wire form, so that a
/// limit added later is compared too.
fn limit_differences(a: &Limits, b: &Limits) -> Vec<String> {
    let (a, b) = (serde_json::to_value(a), serde_json::to_value(b));
    let (Ok(serde_json::Value::Object(a)), Ok(serde_json::Value::Object(b))) = (a, b) else {
        return vec!["limits".into()];
    };
    a.iter()
        .filter(|(k, v)| b.get(*k) != Some(v))
        .map(|(k, _)| format!("limits.{k}"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use kennel_types::policy::ByteSize;

    /// The fields a `get_or_create` 409 names: each that differs, as a request writes it, and
    /// none for the same policy.
    #[test]
    fn a_shape_names_the_fields_that_differ() {
        let base = Policy::default();
        assert_eq!(
            Shape::of(&base).differences(&Shape::of(&base)),
            Vec::<String>::new()
        );
        let mut other = base.clone();
        other.limits.memory = ByteSize(128 << 20);
        other.limits.pids = 64;
        other.network.allow = vec!["example.com:443".into()];
        other.env.insert("K".into(), "secret".into());
        other.tier = Tier::Oci;
        other.oci.runtime = Runtime::Crun;
        let mut named = Shape::of(&base).differences(&Shape::of(&other));
        named.sort();
        assert_eq!(
            named,
            [
                "env",
                "limits.memory",
                "limits.pids",
                "network",
                "runtime",
                "tier"
            ]
        );
        // A runtime outside the oci tier is none: it cannot differ there.
        let mut native = base.clone();
        native.oci.runtime = Runtime::Crun;
        assert_eq!(
            Shape::of(&base).differences(&Shape::of(&native)),
            Vec::<String>::new()
        );
    }
}
