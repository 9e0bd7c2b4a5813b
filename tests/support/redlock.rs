//! Redlock's servers: five independent ones ([`Five`]), and `locked-run` pointed at them all.

use std::process::Command;

use super::cmd::lr;
use super::server::Redis;

/// Five independent servers, for Redlock.
pub struct Five {
    pub servers: Vec<Redis>,
}

impl Five {
    pub fn start() -> Five {
        Five {
            servers: (0..5).map(|_| Redis::start()).collect(),
        }
    }

    pub fn url_args(&self) -> Vec<String> {
        self.servers
            .iter()
            .flat_map(|r| ["-u".to_owned(), r.url()])
            .collect()
    }

    /// How many servers hold `lock:{job}` with `value`.
    pub fn holding(&self, value: &str) -> usize {
        self.servers
            .iter()
            .filter(|r| r.child_alive() && r.get("lock:{job}").as_deref() == Some(value))
            .count()
    }
}

/// `locked-run` on the five servers (as a builder: `lr().on(&five)`). Each may take up to
/// 500 ms to answer an attempt: the default, T/100, is 300 ms for T = 30 s and 20 ms for
/// T = 2 s, which five servers and their clients on two loaded cores can miss, and these tests
/// are not about that timeout (`a_slow_server_does_not_stall_the_acquisition` is).
pub fn locked_run_on(five: &Five) -> Command {
    lr().on(five).into_command()
}
