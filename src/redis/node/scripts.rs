//! Running the protocol's Lua scripts on a node: EVALSHA, falling back to EVAL; EVAL in one
//! request where nothing may depend on the server's script cache; a script followed by other
//! commands in the same write (`WAIT`).

use std::time::Duration;

use super::Node;
use crate::backend::BackendError;
use crate::redis::resp::Reply;
use crate::redis::scripts::Script;

impl Node {
    /// Runs a script: EVALSHA, and EVAL when the server does not know it (restarted, flushed);
    /// EVAL also caches it, so that costs one extra round trip once. `listen`: see
    /// [`Node::exchange`].
    pub async fn eval(
        &self,
        script: &Script,
        keys: &[&str],
        args: &[&str],
        timeout: Duration,
        listen: Option<&str>,
    ) -> Result<Reply, BackendError> {
        let (reply, _) = self
            .eval_then(script, keys, args, timeout, listen, &[])
            .await?;
        Ok(reply)
    }

    /// [`Node::eval`] in one request whatever the server's script cache holds (EVAL with the
    /// source, never EVALSHA then EVAL): for a request that must land whole or not at all,
    /// such as a give-back whose reply may never come.
    pub async fn eval_in_one(
        &self,
        script: &Script,
        keys: &[&str],
        args: &[&str],
        timeout: Duration,
    ) -> Result<Reply, BackendError> {
        let numkeys = keys.len().to_string();
        let command = script_call(b"EVAL", script.source.as_bytes(), &numkeys, keys, args);
        let mut replies = self.exchange(&[&command], timeout, None).await?;
        self.unless_refused(replies.pop().unwrap_or(Reply::Array(None)))
            .await
    }

    /// A script's reply, or, for an error reply, the refusal it is (after which the node starts
    /// afresh: a server that says READONLY may have been demoted, and the sentinels know the
    /// new primary).
    async fn unless_refused(&self, reply: Reply) -> Result<Reply, BackendError> {
        match reply {
            Reply::Error(e) => {
                self.forget().await;
                Err(self.refused(&e))
            }
            reply => Ok(reply),
        }
    }

    /// [`Node::eval`], with `then` sent right after the script in the same write (`WAIT`,
    /// whose count covers the script's writes): the script's reply, and the replies to `then`.
    pub async fn eval_then(
        &self,
        script: &Script,
        keys: &[&str],
        args: &[&str],
        timeout: Duration,
        listen: Option<&str>,
        then: &[&[&[u8]]],
    ) -> Result<(Reply, Vec<Reply>), BackendError> {
        let numkeys = keys.len().to_string();
        let mut command = script_call(b"EVALSHA", script.sha1.as_bytes(), &numkeys, keys, args);
        let mut replies = {
            let mut batch: Vec<&[&[u8]]> = vec![&command];
            batch.extend_from_slice(then);
            self.exchange(&batch, timeout, listen).await?
        };
        if matches!(replies.first(), Some(Reply::Error(e)) if e.starts_with("NOSCRIPT")) {
            command[0] = b"EVAL";
            command[1] = script.source.as_bytes();
            let mut batch: Vec<&[&[u8]]> = vec![&command];
            batch.extend_from_slice(then);
            replies = self.exchange(&batch, timeout, listen).await?;
        }
        let reply = if replies.is_empty() {
            Reply::Array(None)
        } else {
            replies.remove(0)
        };
        Ok((self.unless_refused(reply).await?, replies))
    }
}

/// `VERB SCRIPT NUMKEYS KEYS... ARGS...`: EVAL with the source, or EVALSHA with its SHA1.
fn script_call<'a>(
    verb: &'static [u8],
    script: &'a [u8],
    numkeys: &'a str,
    keys: &[&'a str],
    args: &[&'a str],
) -> Vec<&'a [u8]> {
    let mut command: Vec<&[u8]> = vec![verb, script, numkeys.as_bytes()];
    command.extend(keys.iter().map(|k| k.as_bytes()));
    command.extend(args.iter().map(|a| a.as_bytes()));
    command
}
