//! What to connect to, described once: the URLs, each classified at the door by the scheme its
//! backend declares ([`Endpoint`]), their printable (password-free) form, lists of URLs, where
//! passwords come from (the URL, files, the environment; the sentinels' own), and TLS settings.
//! The command line, the library and `doctor` all describe their endpoints here; only the door
//! (`open.rs`, through the registry) turns endpoints into a backend. Nothing here knows clap,
//! a backend, or the network.

mod list;
mod scheme;
mod secrets;
pub(crate) mod tls;

pub use list::{split, split_checked};
pub use scheme::{Endpoint, Scheme, authority, has_password, missing_slashes, printable};
pub use secrets::{NoSecret, PasswordFrom, SentinelAuth, first_line, from_env};
pub use tls::{TlsOptions, connector};

use std::path::PathBuf;
use std::time::Duration;

/// The password variable `redis-cli` reads, read for Redis and etcd URLs that carry none.
pub(crate) const PASSWORD_VARIABLE: &str = "REDISCLI_AUTH";

/// What to connect to, and what every connection needs besides: one description for a run,
/// `status`, `release`, `doctor` and the library alike.
#[derive(Clone, Debug)]
pub struct Endpoints {
    /// The URLs given (`--url`, or a library caller's); none: `LOCKED_RUN_URL`, else the
    /// registry's default.
    pub given: Vec<String>,
    /// How long one connection attempt may take.
    pub connect_timeout: Duration,
    /// A file whose first line is the password, for URLs that carry none.
    pub password_file: Option<PathBuf>,
    /// A file whose first line is the sentinels' own `password` or `user:password`.
    pub sentinel_password_file: Option<PathBuf>,
    pub tls: TlsOptions,
}

impl Default for Endpoints {
    fn default() -> Endpoints {
        Endpoints {
            given: Vec::new(),
            connect_timeout: Duration::from_secs(5),
            password_file: None,
            sentinel_password_file: None,
            tls: TlsOptions::default(),
        }
    }
}

impl Endpoints {
    /// The URLs `urls` names, with every other setting at its default.
    pub fn new<S: Into<String>>(urls: impl IntoIterator<Item = S>) -> Endpoints {
        Endpoints {
            given: urls.into_iter().map(Into::into).collect(),
            ..Endpoints::default()
        }
    }

    /// The password for URLs that carry none: `--password-file`, else the environment's
    /// `variable` (`REDISCLI_AUTH`); and where it came from, for the line that says a server
    /// refused it.
    pub(crate) fn default_password(
        &self,
        variable: &'static str,
    ) -> Result<Option<(String, PasswordFrom)>, String> {
        let Some(path) = &self.password_file else {
            return Ok(from_env(variable));
        };
        let from = PasswordFrom::File {
            option: "--password-file",
            path: path.clone(),
        };
        match first_line(path) {
            Ok(password) => Ok(Some((password, from))),
            Err(NoSecret::Unreadable(e)) => Err(crate::text::message!(
                "cannot read --password-file {}: {e}",
                path.display()
            )),
            Err(NoSecret::Empty) => Err(crate::text::message!(
                "--password-file {} is empty",
                path.display()
            )),
        }
    }

    /// The sentinels' own credentials: `--sentinel-password-file`, else
    /// `LOCKED_RUN_SENTINEL_AUTH`; `None` when neither is given (the sentinels are then asked
    /// with the data nodes' credentials).
    pub(crate) fn sentinel_auth(&self) -> Result<Option<SentinelAuth>, String> {
        if let Some(path) = &self.sentinel_password_file {
            let text = std::fs::read_to_string(path).map_err(|e| {
                crate::text::message!(
                    "cannot read --sentinel-password-file {}: {e}",
                    path.display()
                )
            })?;
            let from = PasswordFrom::File {
                option: "--sentinel-password-file",
                path: path.clone(),
            };
            return match SentinelAuth::parse(text.lines().next().unwrap_or("")) {
                Some(auth) => Ok(Some(auth.from(from))),
                None => Err(crate::text::message!(
                    "--sentinel-password-file {} is empty (or has no password after `user:`)",
                    path.display()
                )),
            };
        }
        match std::env::var("LOCKED_RUN_SENTINEL_AUTH") {
            Ok(text) if !text.is_empty() => match SentinelAuth::parse(&text) {
                Some(auth) => Ok(Some(auth)),
                None => Err(
                    "LOCKED_RUN_SENTINEL_AUTH has no password: give `password` or \
                             `user:password`"
                        .into(),
                ),
            },
            _ => Ok(None),
        }
    }

    /// Warns when a password was given with the URLs on the command line, where `ps` shows it
    /// to every user (one from `LOCKED_RUN_URL` is the way to give one).
    pub(crate) fn warn_about_visible_passwords(&self) {
        if self.given.iter().any(|u| has_password(u)) {
            tracing::warn!(
                "a password given with --url is visible to every user of this machine (ps); \
                 put the URL in LOCKED_RUN_URL, or the password in --password-file or REDISCLI_AUTH"
            );
        }
    }

    /// `locked-run SUB [-u URL]... [FILE OPTIONS] NAME` as a user can paste it: with the URLs
    /// given, each without its password (a URL from `LOCKED_RUN_URL` is in the environment
    /// already, and the default needs none), and the files the connection needs (paths, never
    /// their contents), quoted for a shell.
    pub(crate) fn pasteable(&self, sub: &str, name: &str) -> String {
        let mut line = format!("locked-run {sub}");
        for url in &self.given {
            line.push_str(" -u ");
            line.push_str(&list::shell_word(&printable(url)));
        }
        let files = [
            ("--password-file", &self.password_file),
            ("--sentinel-password-file", &self.sentinel_password_file),
            ("--tls-ca-cert", &self.tls.ca_cert),
            ("--tls-cert", &self.tls.cert),
            ("--tls-key", &self.tls.key),
        ];
        for (option, path) in files {
            if let Some(path) = path {
                line.push_str(&format!(" {option} "));
                line.push_str(&list::shell_word(&path.to_string_lossy()));
            }
        }
        line.push(' ');
        line.push_str(&list::shell_word(name));
        line
    }
}
