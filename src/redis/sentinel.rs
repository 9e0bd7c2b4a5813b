//! Sentinel: asking the sentinels of a `redis+sentinel://` URL, in turn, where the primary is.

use std::io;
use std::time::Duration;

use super::resp::{Addr, Connection, Reply, share, within};

/// The sentinels of a `redis+sentinel://` URL and the name of the primary they watch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sentinel {
    pub(crate) hosts: Vec<(String, u16)>,
    pub(crate) master: String,
}

impl Sentinel {
    pub fn new(hosts: Vec<(String, u16)>, master: String) -> Sentinel {
        Sentinel { hosts, master }
    }

    pub fn first_host(&self) -> String {
        let (host, port) = &self.hosts[0];
        format!("{host}:{port}")
    }

    /// Asks the sentinels in turn where the primary is, each within its share of `timeout`:
    /// a sentinel that is gone (its host with it: no answer at all) must not leave the others
    /// no time to answer.
    pub async fn primary(&self, timeout: Duration) -> io::Result<Addr> {
        let mut last = io::Error::new(io::ErrorKind::NotFound, "no sentinel given");
        let timeout = share(timeout, self.hosts.len());
        for (host, port) in &self.hosts {
            let sentinel = Addr::Tcp {
                host: host.clone(),
                port: *port,
            };
            let ask = async {
                let mut conn = Connection::connect(&sentinel, None).await?;
                conn.command(&[
                    b"SENTINEL",
                    b"get-master-addr-by-name",
                    self.master.as_bytes(),
                ])
                .await
            };
            match within(timeout, ask).await {
                Ok(Reply::Error(e)) => {
                    last = io::Error::other(format!("sentinel {sentinel} refused: {e}"));
                }
                Ok(reply) => match reply.items() {
                    [ip, port] => {
                        if let (Some(host), Some(port)) = (ip.as_text(), port.as_int()) {
                            return Ok(Addr::Tcp {
                                host,
                                port: port as u16,
                            });
                        }
                    }
                    _ => {
                        last = io::Error::new(
                            io::ErrorKind::NotFound,
                            format!(
                                "sentinel {sentinel} does not know a primary named {:?}",
                                self.master
                            ),
                        )
                    }
                },
                Err(e) => last = io::Error::new(e.kind(), format!("sentinel {sentinel}: {e}")),
            }
        }
        Err(last)
    }
}
