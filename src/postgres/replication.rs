//! What `doctor` says of replication, from what the hosts of a URL answered: on the primary,
//! whether the standbys `synchronous_standby_names` asks for are connected (with none, every
//! grant waits for one until its deadline: every run fails), and of each standby of the URL,
//! what a failover to it would keep, from the primary's own view of it (`pg_stat_replication`'s
//! `sync_state`): a synchronous standby has every grant, an asynchronous or a cascading one
//! (fed by another standby, which cannot be synchronous) may not.

use crate::backend::Level;

/// A standby as the primary lists it in `pg_stat_replication`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Replica {
    /// The application name it connected with (its `cluster_name` unless its `primary_conninfo`
    /// names one), if the role may see it.
    pub name: Option<String>,
    /// `sync`, `quorum`, `potential` or `async`, if the role may see it.
    pub sync_state: Option<String>,
}

/// The primary's replication, as its row of `doctor`'s query tells it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Primary {
    pub address: String,
    pub synchronous_commit: String,
    pub standby_names: String,
    pub replicas: Vec<Replica>,
}

/// A standby of the URL, as its own row of `doctor`'s query tells it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Standby {
    /// What it has received and replayed (LSNs), how long ago its last replayed transaction
    /// committed, and its WAL receiver's state when the role may see it.
    pub received: Option<String>,
    pub replayed: Option<String>,
    pub ago: Option<String>,
    pub receiver: Option<String>,
    /// Where its WAL receiver streams from (`host:port`), when the role may see it.
    pub sender: Option<String>,
    /// The application name the primary knows it by: `application_name` (or
    /// `fallback_application_name`) of its WAL receiver's connection string, else its
    /// `cluster_name`, else `walreceiver` (PostgreSQL's own choice).
    pub name: String,
}

impl Standby {
    /// The name the primary lists it under, from its WAL receiver's connection string (visible
    /// to a role that may see it) and its `cluster_name`.
    pub fn name_of(conninfo: Option<&str>, cluster_name: Option<&str>) -> String {
        let option = |key: &str| {
            conninfo?
                .split_whitespace()
                .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
                .map(|v| v.trim_matches('\'').to_owned())
                .filter(|v| !v.is_empty())
        };
        option("application_name")
            .or_else(|| option("fallback_application_name"))
            .or_else(|| cluster_name.filter(|c| !c.is_empty()).map(str::to_owned))
            .unwrap_or_else(|| "walreceiver".to_owned())
    }
}

/// How many synchronous standbys `synchronous_standby_names` waits for: `FIRST n (...)`,
/// `ANY n (...)` and `n (...)` say n; a plain list, or `*`, one; empty, none.
pub fn required(names: &str) -> usize {
    let names = names.trim();
    if names.is_empty() {
        return 0;
    }
    let upper = names.to_ascii_uppercase();
    let rest = ["FIRST ", "ANY "]
        .iter()
        .find_map(|m| upper.strip_prefix(m))
        .unwrap_or(&upper)
        .trim_start();
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    let after = rest[digits.len()..].trim_start();
    match (digits.parse(), after.starts_with('(')) {
        (Ok(n), true) => n,
        _ => 1,
    }
}

/// The primary's replication line: a FAIL when fewer synchronous standbys are connected than
/// `synchronous_standby_names` waits for (every grant would wait for one until its deadline).
pub fn primary_line(p: &Primary) -> (Level, String) {
    let (sync, names) = (&p.synchronous_commit, p.standby_names.trim());
    let needed = required(names);
    let states: Vec<&str> = p
        .replicas
        .iter()
        .filter_map(|r| r.sync_state.as_deref())
        .collect();
    let synchronous = states
        .iter()
        .filter(|s| matches!(**s, "sync" | "quorum"))
        .count();
    let seen = states.len() == p.replicas.len();
    let n = p.replicas.len();
    match (needed, n) {
        (0, 0) => (
            Level::Ok,
            format!(
                "synchronous_commit = {sync} (each grant asks for on); no standby is connected: \
                 fences last as long as this server keeps its data"
            ),
        ),
        (0, _) => (
            Level::Warn,
            format!(
                "{n} standby(s), all asynchronous (synchronous_standby_names is empty): a \
                 failover can lose grants, two holders at once; set synchronous_standby_names"
            ),
        ),
        (needed, _) if (seen || n == 0) && synchronous < needed => (
            Level::Fail,
            crate::text::message!(
                "synchronous_standby_names = '{names}' waits for {needed} synchronous \
                 standby(s), and {synchronous} is connected ({n} standby(s) in all): every grant \
                 waits for one, so every run fails at its deadline (69); start the standby, or \
                 change synchronous_standby_names"
            ),
        ),
        (_, _) if !seen => (
            Level::Ok,
            format!(
                "{n} standby(s); synchronous_standby_names = '{names}' (which of them are \
                 synchronous, this role may not see: pg_read_all_stats may)"
            ),
        ),
        (_, _) => (
            Level::Ok,
            format!(
                "{n} standby(s), {synchronous} synchronous; synchronous_standby_names = \
                 '{names}': a grant commits only once a synchronous standby has it, so a \
                 failover to one keeps every grant"
            ),
        ),
    }
}

/// A standby's line: its replication state, and what a failover to it keeps, as the primary
/// (`None`: no host of the URL is one) lists it.
pub fn standby_line(s: &Standby, primary: Option<&Primary>) -> (Level, String) {
    let (head, replayed) = state(s);
    let Some(received) = &s.received else {
        return (
            Level::Warn,
            format!(
                "{head} that receives no WAL: {replayed}; it is not replicating (is the primary \
                 reachable from it?)"
            ),
        );
    };
    let state = format!(
        "{head}: received WAL to {}, {replayed}",
        crate::text::printable(received)
    );
    let Some(primary) = primary else {
        return (
            Level::Ok,
            format!("{state}; no primary answered, so what a failover to it keeps is not known"),
        );
    };
    let direct = s
        .sender
        .as_deref()
        .is_none_or(|from| from == primary.address);
    let listed: Vec<&Replica> = primary
        .replicas
        .iter()
        .filter(|r| r.name.as_deref() == Some(s.name.as_str()))
        .collect();
    match (direct, listed.as_slice()) {
        (true, [one]) => match one.sync_state.as_deref() {
            Some("sync" | "quorum") => (
                Level::Ok,
                format!("{state}; a synchronous standby: a failover to it keeps every grant"),
            ),
            Some(other) => (
                Level::Warn,
                crate::text::message!(
                    "an asynchronous standby (sync_state {} on the primary): a failover to it \
                     can lose grants, two holders at once; name it ({}) in \
                     synchronous_standby_names; {state}",
                    crate::text::printable(other),
                    crate::text::printable(&s.name)
                ),
            ),
            None => (
                Level::Ok,
                format!(
                    "{state}; whether it is synchronous, this role may not see on the primary \
                     (pg_read_all_stats may)"
                ),
            ),
        },
        (false, _) => (
            Level::Warn,
            crate::text::message!(
                "a cascading standby (it streams from {}, not from the primary): it cannot be \
                 synchronous, so a failover to it can lose grants; {state}",
                crate::text::printable(s.sender.as_deref().unwrap_or("?"))
            ),
        ),
        (true, _) => (
            Level::Warn,
            crate::text::message!(
                "the primary lists no standby named {}, or several: whether a failover to it \
                 keeps every grant cannot be told; {state}",
                crate::text::printable(&s.name)
            ),
        ),
    }
}

/// `a standby (in recovery, read-only), RECEIVER`, and `replayed to LSN, its last transaction
/// N s ago`.
fn state(s: &Standby) -> (String, String) {
    let replayed = s
        .replayed
        .as_deref()
        .map_or_else(|| "nothing yet".into(), crate::text::printable);
    let ago = s.ago.as_deref().map_or_else(String::new, |a| {
        format!(", its last transaction {}s ago", crate::text::printable(a))
    });
    let receiver = s
        .receiver
        .as_deref()
        .map_or_else(String::new, |r| format!(", {r}"));
    (
        format!("a standby (in recovery, read-only){receiver}"),
        format!("replayed to {replayed}{ago}"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn synchronous_standby_names_say_how_many_are_waited_for() {
        assert_eq!(required(""), 0);
        assert_eq!(required("  "), 0);
        assert_eq!(required("*"), 1);
        assert_eq!(required("s1, s2"), 1);
        assert_eq!(required("FIRST 2 (s1, s2, s3)"), 2);
        assert_eq!(required("any 3 (a, b, c)"), 3);
        assert_eq!(required("2 (s1, s2)"), 2);
        assert_eq!(required("\"2x\""), 1);
    }

    fn replica(name: &str, state: &str) -> Replica {
        Replica {
            name: Some(name.into()),
            sync_state: Some(state.into()),
        }
    }

    fn primary(names: &str, replicas: Vec<Replica>) -> Primary {
        Primary {
            address: "p:5432".into(),
            synchronous_commit: "on".into(),
            standby_names: names.into(),
            replicas,
        }
    }

    /// Issue 43's review: `synchronous_standby_names` set, its standby stopped: doctor said OK
    /// ("no standby is connected") while every run failed, its grant waiting for the standby.
    #[test]
    fn a_synchronous_standby_waited_for_and_missing_is_a_fail() {
        assert_eq!(primary_line(&primary("s1", vec![])).0, Level::Fail);
        let only_async = primary("s1", vec![replica("s2", "async")]);
        let (level, detail) = primary_line(&only_async);
        assert_eq!(level, Level::Fail);
        assert!(detail.contains("waits for 1 synchronous standby(s), and 0 is connected"));
        let two_needed = primary("FIRST 2 (s1, s2)", vec![replica("s1", "sync")]);
        assert_eq!(primary_line(&two_needed).0, Level::Fail);
        assert_eq!(
            primary_line(&primary("s1", vec![replica("s1", "sync")])).0,
            Level::Ok
        );
        assert_eq!(
            primary_line(&primary("ANY 1 (s1)", vec![replica("s1", "quorum")])).0,
            Level::Ok
        );
        assert_eq!(primary_line(&primary("", vec![])).0, Level::Ok);
        assert_eq!(
            primary_line(&primary("", vec![replica("s1", "async")])).0,
            Level::Warn
        );
        // States this role may not see: connected, so not a FAIL.
        let unseen = Replica {
            name: None,
            sync_state: None,
        };
        assert_eq!(primary_line(&primary("s1", vec![unseen])).0, Level::Ok);
    }

    fn standby(name: &str, sender: Option<&str>) -> Standby {
        Standby {
            received: Some("0/3000060".into()),
            replayed: Some("0/3000060".into()),
            ago: None,
            receiver: Some("streaming".into()),
            sender: sender.map(str::to_owned),
            name: name.into(),
        }
    }

    /// Issue 43's review: a cascading standby was "a failover to it keeps what it has"; what
    /// a failover keeps is the primary's word on each standby.
    #[test]
    fn a_standby_is_judged_by_what_the_primary_says_of_it() {
        let p = primary("s1", vec![replica("s1", "sync"), replica("s2", "async")]);
        let (level, detail) = standby_line(&standby("s1", Some("p:5432")), Some(&p));
        assert_eq!(level, Level::Ok, "{detail}");
        assert!(detail.contains("a synchronous standby: a failover to it keeps every grant"));
        let (level, detail) = standby_line(&standby("s2", None), Some(&p));
        assert_eq!(level, Level::Warn);
        assert!(
            detail.contains("an asynchronous standby (sync_state async"),
            "{detail}"
        );
        // Fed by s1: whatever its name, it is no synchronous standby of the primary's.
        let (level, detail) = standby_line(&standby("s1", Some("s1:5433")), Some(&p));
        assert_eq!(level, Level::Warn);
        assert!(
            detail.contains("streams from s1:5433, not from the primary"),
            "{detail}"
        );
        let (level, _) = standby_line(&standby("s9", Some("p:5432")), Some(&p));
        assert_eq!(level, Level::Warn);
        let (level, detail) = standby_line(&standby("s1", None), None);
        assert_eq!(level, Level::Ok);
        assert!(!detail.contains("keeps every grant"), "{detail}");
        let mut silent = standby("s1", None);
        silent.received = None;
        assert_eq!(standby_line(&silent, Some(&p)).0, Level::Warn);
    }

    #[test]
    fn a_standby_is_known_by_the_name_it_connected_with() {
        let conninfo = "user=postgres passfile=/x channel_binding=prefer dbname=replication \
                        host=127.0.0.1 port=5432 fallback_application_name=standby sslmode=prefer";
        assert_eq!(Standby::name_of(Some(conninfo), Some("other")), "standby");
        let named = format!("{conninfo} application_name=s7");
        assert_eq!(Standby::name_of(Some(&named), None), "s7");
        assert_eq!(Standby::name_of(None, Some("s2")), "s2");
        assert_eq!(Standby::name_of(None, Some("")), "walreceiver");
    }
}
