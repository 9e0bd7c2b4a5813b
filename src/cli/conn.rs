//! The connection options every subcommand shares, as clap reads them: the URLs, the password
//! files, TLS, and the connection timeout; turned into the [`Endpoints`] they describe.

use std::time::Duration;

use clap::Args;

use super::values::parse_positive_duration;
use crate::endpoints::{Endpoints, TlsOptions};

#[derive(Args, Debug, Clone, Default)]
pub struct ConnArgs {
    /// Server URL (its help, which names every backend's forms, is the registry's)
    #[arg(short = 'u', long = "url", value_name = "URL", global = true, help = crate::registry::url_help())]
    pub url: Vec<String>,

    /// How long one connection attempt may take
    #[arg(long, value_name = "DUR", default_value = "5s", allow_hyphen_values = true, value_parser = parse_positive_duration, global = true)]
    pub connect_timeout: Duration,

    /// Read the Redis (etcd, PostgreSQL) password from FILE (its first line), for URLs that
    /// carry none
    #[arg(long, value_name = "FILE", global = true)]
    pub password_file: Option<std::path::PathBuf>,

    /// redis+sentinel:// and rediss+sentinel://: the sentinels' own password (`password` or
    /// `user:password`, the first line of FILE), when it is not the data nodes'
    /// [env: LOCKED_RUN_SENTINEL_AUTH holds the same, if this is not given]
    #[arg(long, value_name = "FILE", global = true)]
    pub sentinel_password_file: Option<std::path::PathBuf>,

    /// rediss://, etcds:// and postgres://: trust the CA certificate(s) in this PEM file instead
    /// of the system's (postgres://: means sslmode=verify-full unless the URL says otherwise)
    #[arg(long, value_name = "FILE", global = true)]
    pub tls_ca_cert: Option<std::path::PathBuf>,

    /// rediss://, etcds:// and postgres://: a client certificate (PEM), for servers that ask for
    /// one
    #[arg(long, value_name = "FILE", requires = "tls_key", global = true)]
    pub tls_cert: Option<std::path::PathBuf>,

    /// rediss://, etcds:// and postgres://: the client certificate's private key (PEM)
    #[arg(long, value_name = "FILE", requires = "tls_cert", global = true)]
    pub tls_key: Option<std::path::PathBuf>,
}

impl ConnArgs {
    /// What these options describe.
    pub fn endpoints(&self) -> Endpoints {
        Endpoints {
            given: self.url.clone(),
            connect_timeout: self.connect_timeout,
            password_file: self.password_file.clone(),
            sentinel_password_file: self.sentinel_password_file.clone(),
            tls: TlsOptions {
                ca_cert: self.tls_ca_cert.clone(),
                cert: self.tls_cert.clone(),
                key: self.tls_key.clone(),
            },
        }
    }
}
