//! TLS settings, and the one connector every backend's TLS is made with (`rediss://` and its
//! Sentinel and Cluster forms at every hop, `etcds://`): rustls, the system's roots by default
//! (`--tls-ca-cert` for a private CA), and client certificates (`--tls-cert`, `--tls-key`)
//! where the server asks.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::TlsConnector;
use tokio_rustls::rustls::crypto::CryptoProvider;
use tokio_rustls::rustls::{self, ClientConfig, RootCertStore};

/// The TLS options of the command line.
#[derive(Clone, Debug, Default)]
pub struct TlsOptions {
    /// PEM file of the CA certificate(s) to trust instead of the system's.
    pub ca_cert: Option<PathBuf>,
    /// PEM files of a client certificate (chain) and its key.
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
}

/// A connector for these options; errors are usage errors (unreadable files, bad PEM).
pub fn connector(options: &TlsOptions) -> Result<TlsConnector, String> {
    let mut roots = RootCertStore::empty();
    match &options.ca_cert {
        Some(path) => {
            for cert in certificates(path, "--tls-ca-cert")? {
                roots
                    .add(cert)
                    .map_err(|e| crate::text::message!("--tls-ca-cert {}: {e}", path.display()))?;
            }
        }
        None => {
            let found = rustls_native_certs::load_native_certs();
            for cert in found.certs {
                let _ = roots.add(cert);
            }
            if roots.is_empty() {
                return Err("no system CA certificates found for TLS; give --tls-ca-cert".into());
            }
        }
    }
    let builder = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| crate::text::message!("TLS: {e}"))?
        .with_root_certificates(roots);
    let config = match (&options.cert, &options.key) {
        (Some(cert), Some(key)) => {
            let chain = certificates(cert, "--tls-cert")?;
            let key = PrivateKeyDer::from_pem_file(key)
                .map_err(|e| crate::text::message!("--tls-key {}: {e}", key.display()))?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| crate::text::message!("--tls-cert/--tls-key: {e}"))?
        }
        (None, None) => builder.with_no_client_auth(),
        _ => return Err("--tls-cert and --tls-key go together".into()),
    };
    Ok(TlsConnector::from(Arc::new(config)))
}

/// The crypto every TLS connection of the lock uses.
pub(crate) fn provider() -> Arc<CryptoProvider> {
    // rustls 0.23.48 deprecates *ring*'s provider (it has no post-quantum key exchange); the
    // lock's TLS stays on *ring* (no CMake or NASM to build, a smaller binary) until moving
    // to aws-lc-rs is decided on its own. `allow`, not `expect`: Cargo.lock's rustls has no
    // deprecation, and `cargo install` without `--locked` resolves a newer one.
    #[allow(deprecated)]
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The PEM certificates in `path`, which `option` named; none is an error.
pub(crate) fn certificates(
    path: &Path,
    option: &str,
) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| crate::text::message!("{option} {}: {e}", path.display()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| crate::text::message!("{option} {}: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!(
            "{option} {}: no PEM certificate in it",
            path.display()
        ));
    }
    Ok(certs)
}
