//! The run's leases kept alive on one stream (etcd's `LeaseKeepAlive`), opened on the client's
//! connection when first needed and again after it failed: each keep-alive is one message
//! each way, no request of its own. etcd answers a stream's keep-alives in the order they
//! came, each with its lease's new TTL (0: no such lease any more). A keep-alive whose answer
//! was not awaited (its attempt ended first: a signal, a deadline) leaves its answer on the
//! stream; the next one counts it and passes over it, as an answer to a keep-alive sent
//! before its own proves nothing about its own send instant.

use tokio::time::{Instant, timeout_at};

use super::client::{Client, KeepAlive};
use super::grpc::Failed;
use super::grpc::conn::Conn;
use super::grpc::frame::decode;
use super::grpc::stream::Duplex;
use super::proto::etcdserverpb::{LeaseKeepAliveRequest, LeaseKeepAliveResponse};
use crate::backend::BackendError;

const PATH: &str = "/etcdserverpb.Lease/LeaseKeepAlive";

impl Client {
    /// Keeps each of `leases` alive, by `deadline`: the TTL etcd answered for each, in the
    /// same order (0 when it has no such lease any more: expired, or revoked).
    pub async fn keep_alive(
        &self,
        leases: &[i64],
        deadline: Instant,
    ) -> Result<Vec<i64>, BackendError> {
        let Ok(mut stream) = timeout_at(deadline, self.keepalive.lock()).await else {
            return Err(BackendError::Transient(
                "the keep-alive stream to etcd was busy until the deadline".into(),
            ));
        };
        let members = self.members();
        let mut tried = 0;
        let mut fresh_retry = true;
        let mut renewed_token = false;
        let mut sent = false;
        loop {
            let (conn, reused) = self.conn(deadline).await.map_err(|e| e.unsent_if(!sent))?;
            sent = true;
            let left = deadline.saturating_duration_since(Instant::now());
            let share = Instant::now() + left / (members - tried).max(1) as u32;
            let renewed = timeout_at(share, self.renew_on(&mut stream, &conn, leases)).await;
            let lost = match renewed {
                Ok(Ok(ttls)) => return Ok(ttls),
                Ok(Err(failed)) => {
                    *stream = None;
                    match failed {
                        Failed::Ended(Err(status)) if self.expired(&status) && !renewed_token => {
                            renewed_token = true;
                            self.sign_in(deadline).await?;
                            continue;
                        }
                        Failed::Ended(Err(status)) if !status.transient() => {
                            return Err(self.refused(&status));
                        }
                        failed if reused && fresh_retry && failed.lost_connection() => {
                            fresh_retry = false;
                            self.drop_conn(&conn);
                            continue;
                        }
                        failed => self.failed(&conn, &failed),
                    }
                }
                Err(_) => {
                    *stream = None;
                    self.lost(&conn, "no answer to a keep-alive in time")
                }
            };
            tried += 1;
            if tried >= members || Instant::now() >= deadline {
                return Err(lost);
            }
            tracing::debug!("{lost}: asking the next member");
        }
    }

    /// The keep-alives of `leases` on the stream in `slot`, opened on `conn` if it is not
    /// open there: the TTL of each.
    async fn renew_on(
        &self,
        slot: &mut Option<KeepAlive>,
        conn: &Conn,
        leases: &[i64],
    ) -> Result<Vec<i64>, Failed> {
        if slot.as_ref().is_some_and(|k| k.duplex.conn != conn.id) {
            *slot = None;
        }
        let (first, rest) = leases.split_first().expect("a lease to keep alive");
        let ours = leases.len();
        let stream = match slot {
            Some(stream) => {
                stream.duplex.send(&LeaseKeepAliveRequest { id: *first })?;
                stream.unanswered += 1;
                stream
            }
            None => {
                let token = self.token();
                let request = LeaseKeepAliveRequest { id: *first };
                let duplex = Duplex::open(conn, PATH, token.as_deref(), &request).await?;
                slot.insert(KeepAlive {
                    duplex,
                    unanswered: 1,
                })
            }
        };
        for id in rest {
            stream.duplex.send(&LeaseKeepAliveRequest { id: *id })?;
            stream.unanswered += 1;
        }
        let mut ttls = Vec::with_capacity(ours);
        while stream.unanswered > 0 {
            let reply: LeaseKeepAliveResponse = decode(stream.duplex.next().await?)?;
            stream.unanswered -= 1;
            // The answers before the last `ours` are to keep-alives sent before these.
            if stream.unanswered < ours {
                let asked = leases[ours - 1 - stream.unanswered];
                if reply.id != asked {
                    return Err(Failed::Malformed(format!(
                        "a keep-alive answered for lease {:x}, not {asked:x}",
                        reply.id
                    )));
                }
                ttls.push(reply.ttl);
            }
        }
        Ok(ttls)
    }
}
