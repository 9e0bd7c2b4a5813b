//! Redis Cluster: which node owns the lock's hash slot (asked of the seeds with CLUSTER SLOTS,
//! remembered, and followed on MOVED), the redirections a node answers with, and whether the
//! servers have sharded pub/sub.

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use super::resp::{Addr, Connection, Reply, share, within};

/// The seeds of a `redis+cluster://` URL, and what was learnt of the cluster since.
#[derive(Debug)]
pub struct Cluster {
    seeds: Vec<(String, u16)>,
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
            slot: OnceLock::new(),
            route: Mutex::new(None),
            sharded: AtomicBool::new(true),
        }
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
    pub async fn owner(&self, auth: &[Vec<Vec<u8>>], timeout: Duration) -> io::Result<Addr> {
        let known = self.route.lock().unwrap_or_else(|p| p.into_inner()).clone();
        if let Some(owner) = known {
            return Ok(owner);
        }
        let slot = self.slot.get().copied().unwrap_or(0);
        let owner = slot_owner(&self.seeds, slot, auth, timeout).await?;
        self.moved(owner.clone());
        Ok(owner)
    }
}

/// The node of a Redis Cluster that owns `slot`, asked of the seeds in turn (CLUSTER SLOTS),
/// after `auth` (the URL's user and password, if any).
async fn slot_owner(
    seeds: &[(String, u16)],
    slot: u16,
    auth: &[Vec<Vec<u8>>],
    timeout: Duration,
) -> io::Result<Addr> {
    let mut last = io::Error::new(io::ErrorKind::NotFound, "no cluster node given");
    let timeout = share(timeout, seeds.len());
    for (host, port) in seeds {
        let seed = Addr::Tcp {
            host: host.clone(),
            port: *port,
        };
        let ask = async {
            let mut conn = Connection::connect(&seed, None).await?;
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
        match within(timeout, ask).await {
            Ok(Reply::Error(e)) => last = io::Error::other(format!("cluster node {seed}: {e}")),
            Ok(reply) => {
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
                last = io::Error::new(
                    io::ErrorKind::NotFound,
                    format!("no node of the cluster owns slot {slot}"),
                );
            }
            Err(e) => last = io::Error::new(e.kind(), format!("cluster node {seed}: {e}")),
        }
    }
    Err(last)
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
