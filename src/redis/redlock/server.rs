//! What Redlock asks of each of its servers beyond a single server's protocol: one token on
//! all of them, renewing or taking the lock again where its key is gone, raising the fence
//! counter to the fence the quorum agreed on, and giving back a grant that made no quorum.

use std::time::Duration;

use crate::backend::{BackendError, wall_clock_ms};
use crate::lease::Timings;
use crate::redis::lock::ServerLock;
use crate::redis::replies::as_flag;
use crate::redis::scripts;

/// What a Redlock renewal found on one server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Here {
    /// Ours, and extended (or taken again).
    Ours,
    /// No key: the server restarted empty, or the key lapsed there.
    Absent,
    /// Held by another owner.
    Other,
}

impl ServerLock {
    /// Redlock's second phase: raises this server's fence counter to `fence` (never lowers it)
    /// while the lock here still holds our token. `Ok(true)`: confirmed.
    pub(crate) async fn raise_fence(
        &self,
        fence: u64,
        timeout: Duration,
    ) -> Result<bool, BackendError> {
        let fence = fence.to_string();
        let reply = self
            .node
            .eval(
                &scripts::RAISE_FENCE,
                &[&self.keys.lock, &self.keys.fence, &self.keys.holder],
                &[&self.token(), &fence],
                timeout,
                None,
            )
            .await?;
        as_flag(&reply).ok_or_else(|| self.unexpected(&reply))
    }

    /// The same lock with `token` as its owner's token (Redlock: one token on every server).
    pub(crate) fn with_token(self, token: &str) -> ServerLock {
        self.set_token(token);
        self.without_queue()
    }

    /// Redlock's renewal on this server: extended while ours; where the key is absent, taken
    /// again with `retake` (the fence counter raised to `fence`), else reported as absent.
    pub(crate) async fn renew_here(
        &self,
        timings: &Timings,
        fence: u64,
        retake: bool,
        timeout: Duration,
    ) -> Result<Here, BackendError> {
        let (ttl_ms, fence, since) = (
            timings.ttl_ms(),
            fence.to_string(),
            wall_clock_ms().to_string(),
        );
        let sent = self
            .node
            .eval(
                &scripts::RENEW_OR_RETAKE,
                &[
                    &self.keys.lock,
                    &self.keys.holder,
                    &self.keys.fence,
                    &self.keys.gone,
                ],
                &[
                    &self.token(),
                    &ttl_ms,
                    &fence,
                    &self.host,
                    &self.pid,
                    &self.command,
                    &since,
                    if retake { "1" } else { "0" },
                ],
                timeout,
                None,
            )
            .await;
        // A retake that went unanswered may land after the release.
        let reply = match retake {
            true => self.sent_astray(sent)?,
            false => sent?,
        };
        match reply.as_int() {
            Some(1) => Ok(Here::Ours),
            Some(2) => {
                tracing::info!(
                    "took lock {} again on {}, where its key was gone (restarted empty?)",
                    self.name,
                    self.node.address()
                );
                Ok(Here::Ours)
            }
            Some(-1) => Ok(Here::Absent),
            Some(0) => Ok(Here::Other),
            _ => Err(self.unexpected(&reply)),
        }
    }
}
