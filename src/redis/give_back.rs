//! Giving back: what a run that ends without the lock (or with a grant it cannot use) may hold
//! or have queued on one server is given back in one request, and its token buried in
//! `gone:{NAME}`, so that an attempt still on its way takes nothing when it lands; and the
//! record of requests that went unanswered, whose token the release buries too.

use std::time::Duration;

use crate::backend::BackendError;
use crate::redis::lock::{BURY_FOR, ServerLock};
use crate::redis::replies::as_flag;
use crate::redis::scripts;

impl ServerLock {
    /// Notes that a request with the current token that could take the lock got no answer.
    pub(crate) fn sent_astray<T>(
        &self,
        result: Result<T, BackendError>,
    ) -> Result<T, BackendError> {
        if matches!(result, Err(BackendError::Transient(_))) {
            self.stray.set(true);
        }
        result
    }

    /// Gives back everything the current token may hold or have queued, and buries it (see
    /// `scripts::GIVE_BACK`); `publish` empty wakes nobody. The caller takes a fresh token.
    pub(crate) async fn give_back_within(
        &self,
        publish: &str,
        timeout: Duration,
    ) -> Result<bool, BackendError> {
        self.queued.set(false);
        let token = self.token();
        let bury_ms = BURY_FOR.as_millis().to_string();
        let keys = self.keys.every();
        let holders = self.holders().to_string();
        let args = [
            token.as_str(),
            &self.keys.channel,
            publish,
            &bury_ms,
            &holders,
        ];
        // In one request: the give-back's reply may be lost too, and a NOSCRIPT that never
        // came back would leave the EVAL after it unsent.
        let reply = self
            .node
            .eval_in_one(&scripts::GIVE_BACK, &keys, &args, timeout)
            .await?;
        as_flag(&reply).ok_or_else(|| self.unexpected(&reply))
    }
}
