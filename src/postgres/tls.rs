//! TLS to PostgreSQL through the project's rustls, as libpq's `sslmode` asks: `verify-full`
//! checks the certificate chain and the host name, `verify-ca` the chain only, `require` and
//! `prefer` encrypt without checking (as libpq does; `require` checks the chain when a CA is
//! given, as libpq does when it finds a root certificate). The CA and the client certificate
//! come from the URL (`sslrootcert`, `sslcert`, `sslkey`), else from `--tls-ca-cert`,
//! `--tls-cert`, `--tls-key`.

use std::path::PathBuf;
use std::sync::Arc;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use tokio_rustls::TlsConnector;
use tokio_rustls::rustls::client::WebPkiServerVerifier;
use tokio_rustls::rustls::client::danger::{
    HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier,
};
use tokio_rustls::rustls::crypto::{
    CryptoProvider, verify_tls12_signature, verify_tls13_signature,
};
use tokio_rustls::rustls::{
    self, CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
};

use super::url::SslMode;
use crate::endpoints::tls::{self, certificates};

/// What the connector checks of the server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Check {
    Nothing,
    Chain,
    ChainAndName,
}

/// The files TLS uses, wherever they were named.
#[derive(Clone, Debug, Default)]
pub struct Files {
    pub ca: Option<(PathBuf, &'static str)>,
    pub cert: Option<(PathBuf, &'static str)>,
    pub key: Option<(PathBuf, &'static str)>,
}

/// What `sslmode` and a CA make of the server's certificate.
pub fn check_of(mode: SslMode, has_ca: bool) -> Check {
    match mode {
        SslMode::VerifyFull => Check::ChainAndName,
        SslMode::VerifyCa => Check::Chain,
        SslMode::Require if has_ca => Check::Chain,
        _ => Check::Nothing,
    }
}

/// The connector for `check` with `files`; errors are usage errors (unreadable files, bad PEM).
pub fn connector(check: Check, files: &Files) -> Result<TlsConnector, String> {
    let provider = tls::provider();
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| crate::text::message!("TLS: {e}"))?;
    let verifier: Arc<dyn ServerCertVerifier> = match check {
        Check::Nothing => Arc::new(Unchecked(provider)),
        Check::Chain | Check::ChainAndName => {
            let roots = Arc::new(roots(files)?);
            let webpki = WebPkiServerVerifier::builder_with_provider(roots, provider)
                .build()
                .map_err(|e| crate::text::message!("TLS: {e}"))?;
            match check {
                Check::Chain => Arc::new(ChainOnly(webpki)),
                _ => webpki,
            }
        }
    };
    let builder = builder
        .dangerous()
        .with_custom_certificate_verifier(verifier);
    let config = match (&files.cert, &files.key) {
        (Some((cert, cert_option)), Some((key, key_option))) => {
            let chain = certificates(cert, cert_option)?;
            let key = PrivateKeyDer::from_pem_file(key)
                .map_err(|e| crate::text::message!("{key_option} {}: {e}", key.display()))?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| crate::text::message!("{cert_option}/{key_option}: {e}"))?
        }
        (None, None) => builder.with_no_client_auth(),
        _ => return Err("a client certificate and its key go together (sslcert and sslkey, or --tls-cert and --tls-key)".into()),
    };
    Ok(TlsConnector::from(Arc::new(config)))
}

fn roots(files: &Files) -> Result<RootCertStore, String> {
    let mut roots = RootCertStore::empty();
    match &files.ca {
        Some((path, option)) => {
            for cert in certificates(path, option)? {
                roots
                    .add(cert)
                    .map_err(|e| crate::text::message!("{option} {}: {e}", path.display()))?;
            }
        }
        None => {
            for cert in rustls_native_certs::load_native_certs().certs {
                let _ = roots.add(cert);
            }
            if roots.is_empty() {
                return Err(
                    "no system CA certificates found for TLS; give sslrootcert= or --tls-ca-cert"
                        .into(),
                );
            }
        }
    }
    Ok(roots)
}

/// `sslmode=require` (or `prefer`) without a CA: encrypted, nothing checked, as libpq does.
#[derive(Debug)]
struct Unchecked(Arc<CryptoProvider>);

impl ServerCertVerifier for Unchecked {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// `sslmode=verify-ca`: the chain is checked, the name is not.
#[derive(Debug)]
struct ChainOnly(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp, now)
        {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}
