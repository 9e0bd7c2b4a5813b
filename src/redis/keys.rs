//! The Redis keys and the channel of one NAME. All carry the same `{NAME}` hash tag, so in a
//! Cluster they live in one slot and one script may touch them all.

use crate::name::LockName;

/// The keys of one NAME.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Keys {
    /// The key that holds the owner's value: the plain `SET lock:{NAME} token NX PX` layout,
    /// kept so that programs using that protocol interoperate.
    pub lock: String,
    /// The fencing counter.
    pub fence: String,
    /// The holder's metadata (host, pid, command, since, fence), with the lock's expiry.
    pub holder: String,
    /// The holders of a semaphore (`--holders N`): a sorted set of tokens, by lease end.
    pub holders: String,
    /// The semaphore's N and each holder's metadata.
    pub holders_meta: String,
    /// Fair waiting's queue: waiters' tokens, by arrival.
    pub queue: String,
    /// The same tokens, by the end of each one's keep-alive.
    pub queue_alive: String,
    /// Tokens given back, buried for a while so that a late attempt of theirs is refused.
    pub gone: String,
    /// The NAME's last runs (`history`): their records, newest first.
    pub history: String,
    /// The channel a release is published on, in the same hash slot as the keys.
    pub channel: String,
}

impl Keys {
    pub fn of(name: &LockName) -> Keys {
        let name = name.as_str();
        Keys {
            lock: format!("lock:{{{name}}}"),
            fence: format!("fence:{{{name}}}"),
            holder: format!("holder:{{{name}}}"),
            holders: format!("holders:{{{name}}}"),
            holders_meta: format!("holders-meta:{{{name}}}"),
            queue: format!("queue:{{{name}}}"),
            queue_alive: format!("queue-alive:{{{name}}}"),
            gone: format!("gone:{{{name}}}"),
            history: format!("history:{{{name}}}"),
            channel: format!("released:{{{name}}}"),
        }
    }

    /// Every key, in the order the one-holder acquire and the give-back take them.
    pub fn every(&self) -> [&str; 8] {
        [
            &self.lock,
            &self.fence,
            &self.holder,
            &self.holders,
            &self.holders_meta,
            &self.queue,
            &self.queue_alive,
            &self.gone,
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_share_one_hash_tag() {
        let n = Keys::of(&LockName::new("job").unwrap());
        assert_eq!(n.lock, "lock:{job}");
        assert_eq!(n.fence, "fence:{job}");
        assert_eq!(n.holder, "holder:{job}");
        assert_eq!(n.channel, "released:{job}");
    }
}
