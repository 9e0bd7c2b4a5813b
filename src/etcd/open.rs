//! An etcd cluster as the endpoints name it, ready to connect (nothing is connected yet): its
//! endpoints and user from the URL, the password the URL lacks, and the TLS set-up for
//! `etcds://` (offering ALPN `h2`: etcd speaks gRPC over TLS only on HTTP/2 asked for so).

use std::sync::Arc;

use tokio_rustls::TlsConnector;

use super::{Client, url};
use crate::endpoints::{Endpoints, PASSWORD_VARIABLE, connector};

/// The client of the cluster `url` names.
pub fn client(endpoints: &Endpoints, url: &str) -> Result<Client, String> {
    let mut parsed = url::parse(url)?;
    let tls = match parsed.tls {
        true => {
            let mut config = connector(&endpoints.tls)?.config().as_ref().clone();
            config.alpn_protocols = vec![b"h2".to_vec()];
            Some(TlsConnector::from(Arc::new(config)))
        }
        false => None,
    };
    if parsed.user.is_some() && parsed.password.is_none() {
        (parsed.password, parsed.password_from) =
            endpoints.default_password(PASSWORD_VARIABLE)?.unzip();
    }
    endpoints.warn_about_visible_passwords();
    Ok(Client::new(parsed, tls, endpoints.connect_timeout))
}
