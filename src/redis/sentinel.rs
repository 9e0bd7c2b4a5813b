//! Sentinel: asking the sentinels of a `redis+sentinel://` (or `rediss+sentinel://`, TLS) URL,
//! in turn, where the primary is, as the sentinels' own user when they have one.

use std::io;
use std::time::Duration;

use tokio_rustls::TlsConnector;

use super::auth::{Credentials, Hop, Refused, refusal_line};
use super::resp::{Addr, Connection, Reply, share, within};
use crate::endpoints::SentinelAuth;

/// The sentinels of a sentinel URL, the name of the primary they watch, and how they are
/// spoken to: TLS (`rediss+sentinel://`, the same set-up as for the servers they name) and
/// their own credentials, if they have any apart from the data nodes'.
#[derive(Clone)]
pub struct Sentinel {
    pub(crate) hosts: Vec<(String, u16)>,
    pub(crate) master: String,
    pub(crate) tls: Option<TlsConnector>,
    auth: Option<SentinelAuth>,
}

/// Two URLs name the same sentinels when they list the same hosts and primary.
impl PartialEq for Sentinel {
    fn eq(&self, other: &Sentinel) -> bool {
        self.hosts == other.hosts && self.master == other.master
    }
}

impl Eq for Sentinel {}

impl std::fmt::Debug for Sentinel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sentinel")
            .field("hosts", &self.hosts)
            .field("master", &self.master)
            .field("tls", &self.tls.is_some())
            .finish_non_exhaustive()
    }
}

impl Sentinel {
    pub fn new(hosts: Vec<(String, u16)>, master: String) -> Sentinel {
        Sentinel {
            hosts,
            master,
            tls: None,
            auth: None,
        }
    }

    /// Speaks TLS to the sentinels (and the node speaks it to the primary they name).
    pub fn with_tls(mut self, tls: Option<TlsConnector>) -> Sentinel {
        self.tls = tls;
        self
    }

    /// The sentinels' own credentials; without them, the data nodes' are tried.
    pub fn set_auth(&mut self, auth: Option<SentinelAuth>) {
        self.auth = auth;
    }

    /// Whether the sentinels are asked with a password (their own, or the data nodes').
    pub fn authenticates(&self, data_password: Option<&str>) -> bool {
        self.auth.is_some() || data_password.is_some()
    }

    pub fn first_host(&self) -> String {
        let (host, port) = &self.hosts[0];
        format!("{host}:{port}")
    }

    /// The sentinels' addresses, in the URL's order.
    pub fn addrs(&self) -> Vec<Addr> {
        self.hosts
            .iter()
            .map(|(host, port)| Addr::Tcp {
                host: host.clone(),
                port: *port,
            })
            .collect()
    }

    /// Asks the sentinels in turn where the primary is, each within its share of `timeout`:
    /// a sentinel that is gone (its host with it: no answer at all) must not leave the others
    /// no time to answer. `data` is the data nodes' user and password, which the sentinels
    /// share unless they have their own.
    pub async fn primary(&self, data: Credentials<'_>, timeout: Duration) -> io::Result<Addr> {
        let mut last = io::Error::new(io::ErrorKind::NotFound, "no sentinel given");
        let timeout = share(timeout, self.hosts.len());
        for sentinel in self.addrs() {
            match self.ask(&sentinel, data, timeout).await {
                Ok(primary) => return Ok(primary),
                // A refused password is the likelier cause than a sentinel that is down:
                // it is the one said, unless another sentinel answers.
                Err(e) if last.kind() == io::ErrorKind::PermissionDenied => {
                    tracing::debug!("{e}");
                }
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    /// Asks one sentinel, within `timeout`, where the primary is. Every error names the
    /// sentinel and what failed: the connection, the TLS handshake, the password, the name.
    pub async fn ask(
        &self,
        sentinel: &Addr,
        data: Credentials<'_>,
        timeout: Duration,
    ) -> io::Result<Addr> {
        let (own, used) = match &self.auth {
            Some(auth) => (
                true,
                Credentials {
                    user: auth.user.as_deref(),
                    password: Some(auth.password.as_str()),
                    from: Some(&auth.from),
                },
            ),
            None => (false, data),
        };
        let mut batch: Vec<Vec<&[u8]>> = Vec::new();
        if let Some(password) = used.password {
            let user = used.user;
            let mut command: Vec<&[u8]> = vec![b"AUTH"];
            command.extend(user.map(str::as_bytes));
            command.push(password.as_bytes());
            batch.push(command);
        }
        batch.push(vec![
            b"SENTINEL",
            b"get-master-addr-by-name",
            self.master.as_bytes(),
        ]);
        let ask = async {
            let mut conn = Connection::connect(sentinel, self.tls.as_ref()).await?;
            let batch: Vec<&[&[u8]]> = batch.iter().map(Vec::as_slice).collect();
            conn.pipeline(&batch).await
        };
        let tls = if self.tls.is_some() { " (TLS)" } else { "" };
        let mut replies = within(timeout, ask).await.map_err(|e| {
            let what = match e.kind() {
                io::ErrorKind::TimedOut => {
                    format!("did not answer within {}", crate::text::show(timeout))
                }
                io::ErrorKind::InvalidData if self.tls.is_some() => {
                    format!("TLS handshake failed: {e}")
                }
                _ => e.to_string(),
            };
            // A reply this client will not read is said as a server's would be.
            if let Some(said) =
                crate::redis::resp::hop_sent_bad_reply(&format!("sentinel {sentinel}{tls}"), &e)
            {
                return said;
            }
            io::Error::new(e.kind(), format!("sentinel {sentinel}{tls}: {what}"))
        })?;
        let answer = replies.pop().unwrap_or(Reply::Bulk(None));
        let auth_error = replies.first().and_then(|r| match r {
            // A sentinel without a password: nothing to authenticate.
            Reply::Error(e) if !e.contains("without any password configured") => Some(e.clone()),
            _ => None,
        });
        let server = format!("sentinel {sentinel}{tls}");
        let said = |reply: &str, fallback: String| {
            let line = refusal_line(&server, reply, used, Hop::Sentinel);
            Refused(line.unwrap_or(fallback)).into_io()
        };
        match (&answer, auth_error) {
            // The sentinel's own credentials refused: a set-up to fix, even where the sentinel
            // would answer without them.
            (_, Some(e)) if own => Err(said(
                &e,
                crate::text::message!(
                    "{server} refused the sentinel password ({}): {e}",
                    used.from.map_or_else(String::new, |f| f.to_string())
                ),
            )),
            (Reply::Error(e), Some(auth)) if e.starts_with("NOAUTH") => {
                let line = refusal_line(&server, &auth, used, Hop::Sentinel).unwrap_or_else(|| {
                    crate::text::message!("{server} refused the data nodes' password: {auth}")
                });
                Err(Refused(format!(
                    "{line}; the sentinels were asked with the data nodes' password, as no \
                     password of their own is given: give theirs in LOCKED_RUN_SENTINEL_AUTH or \
                     --sentinel-password-file FILE"
                ))
                .into_io())
            }
            (Reply::Error(e), None) if e.starts_with("NOAUTH") => Err(said(
                e,
                crate::text::message!(
                    "{server} wants a password: give it in LOCKED_RUN_SENTINEL_AUTH or --sentinel-password-file FILE"
                ),
            )),
            (Reply::Error(e), _) => Err(io::Error::other(format!(
                "sentinel {sentinel} refused: {e}"
            ))),
            _ => match answer.items() {
                [ip, port] => match (ip.as_text(), port.as_int()) {
                    (Some(host), Some(port)) => Ok(Addr::Tcp {
                        host,
                        port: port as u16,
                    }),
                    _ => Err(io::Error::other(format!(
                        "sentinel {sentinel} answered {answer:?} for the primary's address"
                    ))),
                },
                _ => Err(io::Error::new(
                    io::ErrorKind::NotFound,
                    format!(
                        "sentinel {sentinel} does not know a primary named {:?}",
                        self.master
                    ),
                )),
            },
        }
    }
}
