//! A run's secrets, for the proxy and the sandbox: the interceptor the proxy injects them
//! with (a CA of the sandbox's own, `kennel_net::Interceptor`), the CA bundle the sandbox
//! trusts it through, and the variables that point its clients at that bundle.

use kennel_net::{InterceptError, Interceptor, Roots, Secret, SecretValue};
use kennel_types::api::RunRequest;
use kennel_types::policy::Policy;

/// Where the sandbox's CA bundle is, in Debian and its images: the file `mounts::trust`
/// shows the sandbox's own bundle at.
pub const BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";

/// The variables that make Python's `ssl` and `requests`, pip, curl and Node trust the bundle
/// (Node adds its file to its own roots).
pub fn trust_env() -> Vec<(String, String)> {
    [
        "SSL_CERT_FILE",
        "REQUESTS_CA_BUNDLE",
        "NODE_EXTRA_CA_CERTS",
        "PIP_CERT",
        "CURL_CA_BUNDLE",
    ]
    .iter()
    .map(|k| (k.to_string(), BUNDLE.to_string()))
    .collect()
}

/// The interceptor for `req`'s secrets, with a CA made for this sandbox; none without secrets.
pub fn interceptor(req: &RunRequest) -> Result<Option<Interceptor>, InterceptError> {
    if req.secrets.is_empty() {
        return Ok(None);
    }
    let mut roots = Roots::public();
    for path in &req.upstream_ca {
        roots.add_pem_file(path)?;
    }
    let secrets = req
        .secrets
        .iter()
        .map(|g| Secret {
            name: g.name.clone(),
            placeholder: g.placeholder.clone(),
            value: SecretValue::new(g.value.clone()),
            header: g.header.clone(),
            hosts: g.hosts.clone(),
        })
        .collect();
    Interceptor::new(secrets, roots).map(Some)
}

/// The bundle the sandbox trusts: its root's own (the image's, or the host's shown read-only)
/// and the interceptor's CA after it.
pub fn ca_bundle(policy: &Policy, interceptor: &Interceptor) -> String {
    let root = policy
        .filesystem
        .rootfs
        .clone()
        .unwrap_or_else(|| std::path::PathBuf::from("/"));
    let own =
        std::fs::read_to_string(root.join(BUNDLE.trim_start_matches('/'))).unwrap_or_default();
    let mut bundle = own;
    if !bundle.is_empty() && !bundle.ends_with('\n') {
        bundle.push('\n');
    }
    bundle.push_str(&interceptor.ca_pem());
    bundle
}
