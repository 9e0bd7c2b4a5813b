//! Redis Cluster: which node owns the lock's hash slot (asked of the seeds with CLUSTER SLOTS,
//! remembered, and followed on MOVED), the redirections a node answers with, whether the
//! servers have sharded pub/sub, and TLS to every node for `rediss+cluster://`.

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use tokio_rustls::TlsConnector;

use super::auth::{Credentials, Hop, Refused, refusal_line};
use super::resp::{Addr, Connection, Reply, share, within};

/// The seeds of a `redis+cluster://` URL, and what was learnt of the cluster since.
pub struct Cluster {
    seeds: Vec<(String, u16)>,
    /// `rediss+cluster://`: TLS to the seeds and to every node they lead to.
    tls: Option<TlsConnector>,
    /// The hash slot of the lock's keys (set by the lock, from its NAME).
    slot: OnceLock<u16>,
    /// The node last found to own `slot` (updated on MOVED).
    route: Mutex<Option<Addr>>,
    /// Cleared when the servers turn out to have no sharded pub/sub (Redis 6).
    sharded: AtomicBool,
}

impl Cluster {
    pub fn new(seeds: Vec<(String, u16)>) -> Cluster {
        Cluster {
            seeds,
            tls: None,
            slot: OnceLock::new(),
            route: Mutex::new(None),
            sharded: AtomicBool::new(true),
        }
    }

    /// Speaks TLS to every node.
    pub fn with_tls(mut self, tls: Option<TlsConnector>) -> Cluster {
        self.tls = tls;
        self
    }

    pub fn tls(&self) -> Option<&TlsConnector> {
        self.tls.as_ref()
    }

    /// The seeds' addresses, in the URL's order.
    pub fn seed_addrs(&self) -> Vec<Addr> {
        self.seeds
            .iter()
            .map(|(host, port)| Addr::Tcp {
                host: host.clone(),
                port: *port,
            })
            .collect()
    }

    /// The hash slot of the lock's keys.
    pub fn slot(&self) -> u16 {
        self.slot.get().copied().unwrap_or(0)
    }

    pub fn seeds(&self) -> &[(String, u16)] {
        &self.seeds
    }

    pub fn first_seed(&self) -> String {
        let (host, port) = &self.seeds[0];
        format!("{host}:{port}")
    }

    /// Sets the hash slot of the lock's keys from their hash tag (the NAME).
    pub fn set_hash_tag(&self, tag: &str) {
        let _ = self.slot.set(crc16(tag.as_bytes()) % 16384);
    }

    /// Whether releases go on a sharded channel: until a server said it has none.
    pub fn sharded(&self) -> bool {
        self.sharded.load(Ordering::Relaxed)
    }

    pub fn without_sharded_pubsub(&self) {
        self.sharded.store(false, Ordering::Relaxed);
    }

    /// MOVED: the slot's owner is `to` from now on.
    pub fn moved(&self, to: Addr) {
        *self.route.lock().unwrap_or_else(|p| p.into_inner()) = Some(to);
    }

    /// The node may be gone for good (its replica promoted): ask the seeds again next time.
    pub fn forget_route(&self) {
        *self.route.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }

    /// The node that owns the lock's slot: the one last found, else asked of the seeds (after
    /// `auth`, the URL's AUTH command if any).
    pub async fn owner(
        &self,
        auth: &[Vec<Vec<u8>>],
        credentials: Credentials<'_>,
        timeout: Duration,
    ) -> io::Result<Addr> {
        let known = self.route.lock().unwrap_or_else(|p| p.into_inner()).clone();
        if let Some(owner) = known {
            return Ok(owner);
        }
        let mut last = io::Error::new(io::ErrorKind::NotFound, "no cluster node given");
        let share = share(timeout, self.seeds.len());
        for seed in self.seed_addrs() {
            match self.ask(&seed, auth, credentials, share).await {
                Ok(owner) => {
                    self.moved(owner.clone());
                    return Ok(owner);
                }
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    /// The node that owns the lock's slot, asked of one `seed` (CLUSTER SLOTS) within
    /// `timeout`, after `auth` (the URL's user and password, if any, which `credentials`
    /// describe for the line that says they were refused). Errors name the seed.
    pub async fn ask(
        &self,
        seed: &Addr,
        auth: &[Vec<Vec<u8>>],
        credentials: Credentials<'_>,
        timeout: Duration,
    ) -> io::Result<Addr> {
        let slot = self.slot();
        let Addr::Tcp { host, .. } = seed else {
            return Err(io::Error::other("a cluster seed is host:port"));
        };
        let tls = if self.tls.is_some() { " (TLS)" } else { "" };
        let ask = async {
            let mut conn = Connection::connect(seed, self.tls.as_ref()).await?;
            let auth = super::resp::as_batch(auth);
            let mut batch: Vec<&[&[u8]]> = auth.iter().map(Vec::as_slice).collect();
            let slots: [&[u8]; 2] = [b"CLUSTER", b"SLOTS"];
            batch.push(&slots);
            let replies = conn.pipeline(&batch).await?;
            // A refused AUTH is the answer; else the last reply is CLUSTER SLOTS'.
            let refused = replies.iter().find(|r| matches!(r, Reply::Error(_)));
            refused
                .or(replies.last())
                .cloned()
                .ok_or_else(|| io::Error::other("no reply to CLUSTER SLOTS"))
        };
        let reply = within(timeout, ask).await.map_err(|e| {
            let what = match e.kind() {
                io::ErrorKind::InvalidData if self.tls.is_some() => {
                    format!("TLS handshake failed: {e}")
                }
                _ => e.to_string(),
            };
            // A reply this client will not read is said as a server's would be.
            if let Some(said) =
                crate::redis::resp::hop_sent_bad_reply(&format!("cluster node {seed}{tls}"), &e)
            {
                return said;
            }
            io::Error::new(e.kind(), format!("cluster node {seed}{tls}: {what}"))
        })?;
        if let Reply::Error(e) = &reply {
            let server = format!("cluster node {seed}{tls}");
            if let Some(line) = refusal_line(&server, e, credentials, Hop::Data) {
                return Err(Refused(line).into_io());
            }
            // A refused password is a set-up to fix, not a node that is gone.
            let kind = match e.split_whitespace().next() {
                Some("WRONGPASS" | "NOAUTH" | "NOPERM") => io::ErrorKind::PermissionDenied,
                _ => io::ErrorKind::Other,
            };
            return Err(io::Error::new(
                kind,
                format!("cluster node {seed}{tls}: {e}"),
            ));
        }
        for range in reply.items() {
            let items = range.items();
            let (Some(start), Some(end)) = (
                items.first().and_then(Reply::as_int),
                items.get(1).and_then(Reply::as_int),
            ) else {
                continue;
            };
            if (start..=end).contains(&i64::from(slot)) {
                let primary = items.get(2).map(Reply::items).unwrap_or_default();
                if let (Some(ip), Some(port)) = (
                    primary.first().and_then(Reply::as_text),
                    primary.get(1).and_then(Reply::as_int),
                ) {
                    // An empty address means "the node you asked".
                    let host = if ip.is_empty() { host.clone() } else { ip };
                    return Ok(Addr::Tcp {
                        host,
                        port: port as u16,
                    });
                }
            }
        }
        Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!("no node of the cluster owns slot {slot}"),
        ))
    }
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster")
            .field("seeds", &self.seeds)
            .field("tls", &self.tls.is_some())
            .field("slot", &self.slot.get())
            .finish_non_exhaustive()
    }
}

/// A MOVED or ASK among the replies: the kind, and where to go.
pub fn redirection(replies: &[Reply]) -> Option<(&'static str, Addr)> {
    replies.iter().find_map(|reply| {
        let Reply::Error(e) = reply else { return None };
        let mut words = e.split_whitespace();
        let kind = match words.next()? {
            "MOVED" => "MOVED",
            "ASK" => "ASK",
            _ => return None,
        };
        let (host, port) = words.nth(1)?.rsplit_once(':')?;
        Some((
            kind,
            Addr::Tcp {
                host: host.to_owned(),
                port: port.parse().ok()?,
            },
        ))
    })
}

/// CRC16/XMODEM, Redis Cluster's key hash (slot = crc16(tag) mod 16384).
pub fn crc16(data: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &byte in data {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_and_redirections() {
        // The reference value of CLUSTER KEYSLOT 123456789.
        assert_eq!(crc16(b"123456789") % 16384, 12739);
        let e = Reply::Error("MOVED 3999 127.0.0.1:6381".into());
        assert_eq!(
            redirection(&[Reply::Int(1), e]),
            Some((
                "MOVED",
                Addr::Tcp {
                    host: "127.0.0.1".into(),
                    port: 6381
                }
            ))
        );
        assert_eq!(redirection(&[Reply::Error("ERR other".into())]), None);
    }
}
