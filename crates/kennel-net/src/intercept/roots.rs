//! The CAs the proxy trusts upstream: the public web's (webpki-roots, the same everywhere
//! Kennel runs, rather than whatever the host has installed) and any extra PEM CAs the server's
//! configuration names (a company's CA, or a test's loopback upstream).

use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;
use rustls::{ClientConfig, RootCertStore};

use super::error::InterceptError;

/// Trust anchors for upstream TLS.
#[derive(Debug, Clone, Default)]
pub struct Roots {
    public: bool,
    extra: Vec<CertificateDer<'static>>,
}

impl Roots {
    /// The public web's CAs (webpki-roots).
    pub fn public() -> Roots {
        Roots {
            public: true,
            extra: vec![],
        }
    }

    /// No CA at all: only what [`Roots::add_pem`] adds.
    pub fn none() -> Roots {
        Roots::default()
    }

    /// Adds the certificates of `pem` (from `what`, a file's name for errors); how many.
    pub fn add_pem(&mut self, pem: &[u8], what: &str) -> Result<usize, InterceptError> {
        let certs = CertificateDer::pem_slice_iter(pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| InterceptError::Pem {
                what: what.into(),
                error: e.to_string(),
            })?;
        if certs.is_empty() {
            return Err(InterceptError::NoPem(what.into()));
        }
        let n = certs.len();
        self.extra.extend(certs);
        Ok(n)
    }

    /// Adds the certificates of the PEM file at `path`; how many.
    pub fn add_pem_file(&mut self, path: &std::path::Path) -> Result<usize, InterceptError> {
        let what = path.display().to_string();
        let pem = std::fs::read(path).map_err(|e| InterceptError::Pem {
            what: what.clone(),
            error: e.to_string(),
        })?;
        self.add_pem(&pem, &what)
    }

    /// A TLS client that verifies fully against these roots and offers ALPN `http/1.1`.
    pub(crate) fn client_config(&self) -> Result<Arc<ClientConfig>, InterceptError> {
        let mut store = RootCertStore::empty();
        if self.public {
            store.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
        }
        for c in &self.extra {
            store.add(c.clone())?;
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_root_certificates(store)
            .with_no_client_auth();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    }
}
