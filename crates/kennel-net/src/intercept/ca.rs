//! The sandbox's CA: ECDSA P-256, made when the sandbox starts, its key only in this process's
//! memory, with X.509 name constraints that permit exactly the secrets' hosts, so that even a
//! leaked CA signs nothing a client would take for another name.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use kennel_types::net::Rule;
use rcgen::{
    BasicConstraints, CertificateParams, CidrSubnet, DnType, ExtendedKeyUsagePurpose,
    GeneralSubtree, IsCa, Issuer, KeyPair, KeyUsagePurpose, NameConstraints,
    PKCS_ECDSA_P256_SHA256,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::ServerConfig;

use super::error::InterceptError;

/// How long the CA and its leaves are valid: longer than any sandbox lives, short enough that
/// a copy is soon worthless. Not before an hour ago, for clocks a little behind.
const VALIDITY: Duration = Duration::from_secs(30 * 24 * 3600);
const BACKDATE: Duration = Duration::from_secs(3600);

pub(crate) struct Ca {
    issuer: Issuer<'static, KeyPair>,
    cert: CertificateDer<'static>,
    pem: String,
}

impl Ca {
    /// A new CA whose name constraints permit the hosts of `rules`.
    pub(crate) fn new(rules: &[&Rule]) -> Result<Ca, InterceptError> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params
            .distinguished_name
            .push(DnType::CommonName, "Kennel sandbox secrets CA");
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        params.name_constraints = Some(constraints(rules));
        validity(&mut params);
        let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256)?;
        let cert = params.self_signed(&key)?;
        Ok(Ca {
            pem: cert.pem(),
            cert: cert.der().clone(),
            issuer: Issuer::new(params, key),
        })
    }

    pub(crate) fn pem(&self) -> String {
        self.pem.clone()
    }

    /// A leaf for `host` signed by this CA: its certificate and its key. (The name constraints
    /// make one for a host outside them worthless; the caller makes them only for covered
    /// hosts anyway.)
    pub(crate) fn leaf(&self, host: &str) -> Result<(rcgen::Certificate, KeyPair), InterceptError> {
        let mut params = CertificateParams::new(vec![host.to_string()])?;
        params.distinguished_name.push(DnType::CommonName, host);
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.use_authority_key_identifier_extension = true;
        validity(&mut params);
        let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256)?;
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok((cert, key))
    }

    /// A TLS server configuration presenting `host`'s leaf (and the CA), offering ALPN
    /// `http/1.1` only: the proxy rewrites HTTP/1.1 alone.
    pub(crate) fn server_config(&self, host: &str) -> Result<Arc<ServerConfig>, InterceptError> {
        let (leaf, key) = self.leaf(host)?;
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_single_cert(vec![leaf.der().clone(), self.cert.clone()], key)?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    }
}

/// Permitted DNS subtrees for exactly the rules' hosts. X.509 has no exact-name form: a
/// constraint `example.com` also admits its subdomains, so those are excluded (`.example.com`,
/// subdomains only) unless a wildcard or another rule needs them. A wildcard rule
/// `*.example.com` permits `.example.com`. Every IP address is excluded: no rule names one.
fn constraints(rules: &[&Rule]) -> NameConstraints {
    let mut permitted = vec![];
    let mut excluded = vec![];
    for r in rules {
        let sub = format!(".{}", r.domain);
        if r.wildcard {
            permitted.push(GeneralSubtree::DnsName(sub));
            continue;
        }
        permitted.push(GeneralSubtree::DnsName(r.domain.clone()));
        let below_needed = rules
            .iter()
            .any(|o| o.domain.ends_with(&sub) || (o.wildcard && o.domain == r.domain));
        if !below_needed {
            excluded.push(GeneralSubtree::DnsName(sub));
        }
    }
    permitted.sort_by_key(dns_name);
    permitted.dedup_by_key(|s| dns_name(s));
    excluded.sort_by_key(dns_name);
    excluded.dedup_by_key(|s| dns_name(s));
    excluded.push(GeneralSubtree::IpAddress(CidrSubnet::V4([0; 4], [0; 4])));
    excluded.push(GeneralSubtree::IpAddress(CidrSubnet::V6([0; 16], [0; 16])));
    NameConstraints {
        permitted_subtrees: permitted,
        excluded_subtrees: excluded,
    }
}

fn dns_name(s: &GeneralSubtree) -> String {
    match s {
        GeneralSubtree::DnsName(n) => n.clone(),
        _ => String::new(),
    }
}

fn validity(params: &mut CertificateParams) {
    let now = SystemTime::now();
    params.not_before = (now - BACKDATE).into();
    params.not_after = (now + VALIDITY).into();
}
