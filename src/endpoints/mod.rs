//! What to connect to, described once: the URLs and the kind of store they name, their
//! printable (password-free) form, the default URL and lists of URLs, where passwords come from
//! (the URL, files, the environment; the sentinels' own), and TLS settings. The command line,
//! the library and `doctor` all describe their endpoints here; only `open.rs` turns endpoints
//! into a backend. Nothing here knows clap or touches the network.

mod list;
mod scheme;
mod secrets;
pub(crate) mod tls;

pub use scheme::{Scheme, authority, has_password, missing_slashes, printable};
pub use secrets::{NoSecret, PasswordFrom, SentinelAuth, first_line, from_env};
pub use tls::{TlsOptions, connector};

use std::path::PathBuf;
use std::time::Duration;

/// Where the lock lives when no URL is given.
pub(crate) const DEFAULT_URL: &str = "redis://127.0.0.1:6379";

/// The password variable `redis-cli` reads, read for Redis and etcd URLs that carry none.
pub(crate) const PASSWORD_VARIABLE: &str = "REDISCLI_AUTH";

/// What to connect to, and what every connection needs besides: one description for a run,
/// `status`, `release`, `doctor` and the library alike.
#[derive(Clone, Debug)]
pub struct Endpoints {
    /// The URLs given (`--url`, or a library caller's); none: `LOCKED_RUN_URL`, else
    /// `redis://127.0.0.1:6379`.
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

/// The store the URLs name, each kind with the URLs it is opened from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Store {
    /// One Redis server (any topology), or several independent ones: Redlock.
    Redis(Vec<String>),
    /// One etcd cluster: one URL listing its endpoints.
    Etcd(String),
    /// A directory of this host.
    Dir(String),
    /// One PostgreSQL database: one URL (several hosts go in it).
    Postgres(String),
}

impl Endpoints {
    /// The URLs `urls` names, with every other setting at its default.
    pub fn new<S: Into<String>>(urls: impl IntoIterator<Item = S>) -> Endpoints {
        Endpoints {
            given: urls.into_iter().map(Into::into).collect(),
            ..Endpoints::default()
        }
    }

    /// The URLs: those given, else `LOCKED_RUN_URL`'s, else [`DEFAULT_URL`]. An error when
    /// `LOCKED_RUN_URL` does not split into URLs (it never shows the pieces).
    pub(crate) fn urls(&self) -> Result<Vec<String>, String> {
        if !self.given.is_empty() {
            return Ok(self.given.clone());
        }
        match std::env::var("LOCKED_RUN_URL") {
            Ok(value) if !value.trim().is_empty() => list::split_checked(&value),
            _ => Ok(vec![DEFAULT_URL.to_owned()]),
        }
    }

    /// The store the URLs name, once every refusal that concerns them together is made: a
    /// `file://` or `etcd://` URL with others, TLS files with no URL that speaks TLS, the
    /// sentinels' password with no sentinel. Each backend checks its own URLs in full when it
    /// is opened.
    pub(crate) fn store(&self) -> Result<Store, String> {
        let urls = self.urls()?;
        if let Some(line) = urls.iter().find_map(|u| missing_slashes(u)) {
            return Err(line);
        }
        let schemes: Vec<Scheme> = urls.iter().map(|u| Scheme::of(u)).collect();
        let tls_files =
            self.tls.ca_cert.is_some() || self.tls.cert.is_some() || self.tls.key.is_some();
        if let Some(i) = schemes
            .iter()
            .position(|s| matches!(s, Scheme::Etcd { .. }))
        {
            if urls.len() > 1 {
                return Err(
                    "an etcd:// URL names a whole cluster: give one, listing its endpoints \
                     (etcd://HOST:PORT,HOST:PORT), and no other URL"
                        .into(),
                );
            }
            if self.sentinel_password_file.is_some() {
                return Err("--sentinel-password-file is for redis+sentinel:// and \
                            rediss+sentinel:// URLs, and an etcd:// URL is given"
                    .into());
            }
            if tls_files && !schemes[i].tls() {
                // Ignoring them would leave a connection believed encrypted in plain text.
                return Err(
                    "--tls-ca-cert, --tls-cert and --tls-key are for etcds:// URLs \
                            (etcd over TLS), and an etcd:// URL is given"
                        .into(),
                );
            }
            return Ok(Store::Etcd(urls[i].clone()));
        }
        if let Some(i) = schemes.iter().position(|s| *s == Scheme::Postgres) {
            if urls.len() > 1 {
                return Err(
                    "a postgres:// URL names one database: give one (several hosts go in it: \
                     postgres://HOST:PORT,HOST:PORT/DB), and no other URL"
                        .into(),
                );
            }
            if self.sentinel_password_file.is_some() {
                return Err("--sentinel-password-file is for redis+sentinel:// and \
                            rediss+sentinel:// URLs, and a postgres:// URL is given"
                    .into());
            }
            // The --tls-* files apply (sslmode says whether TLS is used).
            return Ok(Store::Postgres(urls[i].clone()));
        }
        if tls_files && !schemes.iter().any(|s| s.tls()) {
            // Ignoring them would leave a connection believed encrypted in plain text.
            return Err(
                "--tls-ca-cert, --tls-cert and --tls-key are for rediss:// URLs (and \
                 rediss+sentinel://, rediss+cluster://), and none is given (redis+sentinel:// \
                 and redis+cluster:// connect without TLS)"
                    .into(),
            );
        }
        let sentinels = schemes
            .iter()
            .any(|s| matches!(s, Scheme::Redis { sentinel: true, .. }));
        if !sentinels && self.sentinel_password_file.is_some() {
            return Err("--sentinel-password-file is for redis+sentinel:// and \
                        rediss+sentinel:// URLs, and none is given"
                .into());
        }
        if let Some(i) = schemes.iter().position(|s| *s == Scheme::File) {
            if urls.len() > 1 {
                return Err(
                    "file:// keeps locks on this host only: it cannot be combined with other \
                     URLs (give one file:// URL, or only Redis URLs)"
                        .into(),
                );
            }
            return Ok(Store::Dir(urls[i].clone()));
        }
        Ok(Store::Redis(urls))
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
