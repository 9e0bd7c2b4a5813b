//! The connection options every subcommand shares: the URLs, the password, TLS, and the
//! connection timeout; and a `locked-run` command line for the same lock, as it can be pasted.

use std::time::Duration;

use clap::Args;

use super::DEFAULT_URL;
use super::values::{parse_positive_duration, shell_word, split_urls_checked};
use crate::exit::Failure;
use crate::name::LockName;
use crate::redis::auth::PasswordFrom;

#[derive(Args, Debug, Clone, Default)]
pub struct ConnArgs {
    /// Server URL: redis://[user@]host[:port][/db], rediss:// (TLS), redis+unix:///path,
    /// redis+sentinel://host:port[,...]/MASTER, redis+cluster://host:port[,...] (TLS at every
    /// hop: rediss+sentinel://, rediss+cluster://); three or more
    /// for Redlock; etcd://[user@]host:port[,host:port...] for an etcd cluster (etcds:// for
    /// TLS); or file:///DIR for locks on this host only, with no server
    /// [env: LOCKED_RUN_URL] [default: redis://127.0.0.1:6379]. Give passwords through
    /// LOCKED_RUN_URL, --password-file or REDISCLI_AUTH, not on the command line, which `ps`
    /// shows.
    #[arg(short = 'u', long = "url", value_name = "URL", global = true)]
    pub url: Vec<String>,

    /// How long one connection attempt may take
    #[arg(long, value_name = "DUR", default_value = "5s", allow_hyphen_values = true, value_parser = parse_positive_duration, global = true)]
    pub connect_timeout: Duration,

    /// Read the Redis (or etcd) password from FILE (its first line), for URLs that carry none
    #[arg(long, value_name = "FILE", global = true)]
    pub password_file: Option<std::path::PathBuf>,

    /// redis+sentinel:// and rediss+sentinel://: the sentinels' own password (`password` or
    /// `user:password`, the first line of FILE), when it is not the data nodes'
    /// [env: LOCKED_RUN_SENTINEL_AUTH holds the same, if this is not given]
    #[arg(long, value_name = "FILE", global = true)]
    pub sentinel_password_file: Option<std::path::PathBuf>,

    /// rediss:// and etcds://: trust the CA certificate(s) in this PEM file instead of the system's
    #[arg(long, value_name = "FILE", global = true)]
    pub tls_ca_cert: Option<std::path::PathBuf>,

    /// rediss:// and etcds://: a client certificate (PEM), for servers that ask for one
    #[arg(long, value_name = "FILE", requires = "tls_key", global = true)]
    pub tls_cert: Option<std::path::PathBuf>,

    /// rediss:// and etcds://: the client certificate's private key (PEM)
    #[arg(long, value_name = "FILE", requires = "tls_cert", global = true)]
    pub tls_key: Option<std::path::PathBuf>,
}

impl ConnArgs {
    pub fn tls(&self) -> crate::redis::tls::TlsOptions {
        crate::redis::tls::TlsOptions {
            ca_cert: self.tls_ca_cert.clone(),
            cert: self.tls_cert.clone(),
            key: self.tls_key.clone(),
        }
    }

    /// The password for URLs that carry none (`--password-file`, else `REDISCLI_AUTH`), and
    /// where it came from (for the line that says a server refused it).
    pub fn default_password_from(&self) -> Result<Option<(String, PasswordFrom)>, Failure> {
        if let Some(path) = &self.password_file {
            let text = std::fs::read_to_string(path).map_err(|e| {
                Failure::usage(format!(
                    "cannot read --password-file {}: {e}",
                    path.display()
                ))
            })?;
            let password = text.lines().next().unwrap_or("").to_owned();
            if password.is_empty() {
                return Err(Failure::usage(format!(
                    "--password-file {} is empty",
                    path.display()
                )));
            }
            let from = PasswordFrom::File {
                option: "--password-file",
                path: path.clone(),
            };
            return Ok(Some((password, from)));
        }
        Ok(crate::backend::env_password().map(|p| (p, PasswordFrom::Env("REDISCLI_AUTH"))))
    }

    /// The sentinels' own credentials: `--sentinel-password-file`, else
    /// `LOCKED_RUN_SENTINEL_AUTH`; `None` when neither is given (the sentinels are then asked
    /// with the data nodes' credentials).
    pub fn sentinel_auth(&self) -> Result<Option<crate::redis::sentinel::SentinelAuth>, Failure> {
        use crate::redis::sentinel::SentinelAuth;
        if let Some(path) = &self.sentinel_password_file {
            let text = std::fs::read_to_string(path).map_err(|e| {
                Failure::usage(format!(
                    "cannot read --sentinel-password-file {}: {e}",
                    path.display()
                ))
            })?;
            let line = text.lines().next().unwrap_or("");
            let from = PasswordFrom::File {
                option: "--sentinel-password-file",
                path: path.clone(),
            };
            return match SentinelAuth::parse(line) {
                Some(auth) => Ok(Some(auth.from(from))),
                None => Err(Failure::usage(format!(
                    "--sentinel-password-file {} is empty (or has no password after `user:`)",
                    path.display()
                ))),
            };
        }
        match std::env::var("LOCKED_RUN_SENTINEL_AUTH") {
            Ok(text) if !text.is_empty() => match SentinelAuth::parse(&text) {
                Some(auth) => Ok(Some(auth)),
                None => Err(Failure::usage(
                    "LOCKED_RUN_SENTINEL_AUTH has no password: give `password` or `user:password`",
                )),
            },
            _ => Ok(None),
        }
    }

    /// Warns when a password was given on the command line, where `ps` shows it to every user.
    pub fn warn_about_visible_passwords(&self) {
        if self.url.iter().any(|u| match crate::etcd::is_etcd_url(u) {
            true => crate::etcd::has_password(u),
            false => crate::redis::url::url_has_password(u),
        }) {
            tracing::warn!(
                "a password given with --url is visible to every user of this machine (ps); \
                 put the URL in LOCKED_RUN_URL, or the password in --password-file or REDISCLI_AUTH"
            );
        }
    }

    /// `locked-run SUB [-u URL]... [FILE OPTIONS] NAME` as a user can paste it: with the URLs
    /// given with `--url`, each without its password (a URL from `LOCKED_RUN_URL` is in the
    /// environment already, and the default needs none), and the files the connection needs
    /// (`--password-file`, the TLS certificates and key: paths, never their contents), quoted
    /// for a shell.
    pub fn pasteable(&self, sub: &str, name: &LockName) -> String {
        let mut line = format!("locked-run {sub}");
        for url in &self.url {
            line.push_str(" -u ");
            let printable = match crate::etcd::is_etcd_url(url) {
                true => crate::etcd::printable(url),
                false => crate::redis::url::printable(url),
            };
            line.push_str(&shell_word(&printable));
        }
        let files = [
            ("--password-file", &self.password_file),
            ("--sentinel-password-file", &self.sentinel_password_file),
            ("--tls-ca-cert", &self.tls_ca_cert),
            ("--tls-cert", &self.tls_cert),
            ("--tls-key", &self.tls_key),
        ];
        for (option, path) in files {
            if let Some(path) = path {
                line.push_str(&format!(" {option} "));
                line.push_str(&shell_word(&path.to_string_lossy()));
            }
        }
        line.push(' ');
        line.push_str(&shell_word(name.as_str()));
        line
    }

    /// The server URLs: `--url`, else `LOCKED_RUN_URL`, else the default. A usage error
    /// when `LOCKED_RUN_URL` does not split into URLs (it never shows the pieces).
    pub fn urls(&self) -> Result<Vec<String>, String> {
        if !self.url.is_empty() {
            return Ok(self.url.clone());
        }
        match std::env::var("LOCKED_RUN_URL") {
            Ok(value) if !value.trim().is_empty() => split_urls_checked(&value),
            _ => Ok(vec![DEFAULT_URL.to_owned()]),
        }
    }
}
