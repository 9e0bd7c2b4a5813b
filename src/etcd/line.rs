//! Where a run stands in NAME's line: the keys under `NAME/` in the order of their create
//! revisions (arrival order), each saying in its value the mode its run holds in. What a run
//! may do, and which key's change it waits for, follows from the keys before its own alone:
//!
//! - exclusive (etcd's recipe, and `etcdctl lock`, whose keys have empty values): it holds when
//!   its key is the first; it waits for the key just before its own to go.
//! - `--shared`: it holds when no exclusive key is before its own (the shared runs at the head
//!   hold together, and a shared run never passes an exclusive one queued before it); it
//!   waits for the last exclusive key before its own to go. Every shared run behind that key
//!   waits on it: they are admitted together, each woken once.
//! - `--holders N`: the N first keys hold. Holders leave in any order, so the first waiter
//!   (N keys before it) waits for any key under `NAME/` to go; a later waiter waits for the key
//!   just before its own to go or to be written: a waiter that takes a place writes its key
//!   again, which tells the one behind it that it is the first waiter now.
//!
//! Modes mix as on Redis: exclusive and shared runs queue together; a run of another N (or a
//! semaphore's run beside exclusive or shared ones) is a usage error. What decides is the first
//! key's mode, the mode NAME is held in: a key of another mode further on belongs to a run that
//! found the first key of another mode too, and is on its way out, so it is no reason to refuse
//! anyone (it only counts as a place, for an instant).

use serde_json::Value;

use super::wire::Kv;
use crate::backend::Mode;

/// The mode a key's run holds in, from its value: `locked-run`'s JSON says `"mode"`
/// (`"shared"`, `"exclusive"`, `"holders"` with `"limit"`); any other value (etcdctl's is empty)
/// is an exclusive holder's.
pub fn mode_of(kv: &Kv) -> Mode {
    let value: Value = serde_json::from_slice(&kv.value).unwrap_or_default();
    match value["mode"].as_str() {
        Some("shared") => Mode::Shared,
        Some("holders") => {
            let limit = value["limit"].as_u64().unwrap_or(1);
            Mode::of_holders(u32::try_from(limit).unwrap_or(u32::MAX))
        }
        _ => Mode::Exclusive,
    }
}

/// The `"mode"` and `"limit"` written in a run's key, as [`mode_of`] reads them.
pub fn mode_fields(mode: Mode) -> (&'static str, Option<u32>) {
    match mode {
        Mode::Exclusive => ("exclusive", None),
        Mode::Shared => ("shared", None),
        Mode::Holders(n) => ("holders", Some(n)),
    }
}

/// What a waiter's watch waits for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Awaited {
    /// The key's delete; with `puts`, any write to it too.
    Key { key: String, puts: bool },
    /// The delete of any key under `NAME/`.
    AnyDelete,
}

/// A run's standing in the line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Standing {
    Holds,
    Waits(Awaited),
    /// A run of another mode is before this one.
    Mismatch(Mode),
}

/// The standing of a run of mode `ours` whose key has `before` before it, in arrival order.
/// An exclusive run may be given only the first and the last key before its own: it looks at
/// no other.
pub fn standing(ours: Mode, before: &[Kv]) -> Standing {
    let (Some(first), Some(last)) = (before.first(), before.last()) else {
        return Standing::Holds;
    };
    let wait_on = |kv: &Kv, puts| {
        Standing::Waits(Awaited::Key {
            key: kv.key.clone(),
            puts,
        })
    };
    match ours {
        Mode::Exclusive => match mode_of(first) {
            theirs @ Mode::Holders(_) => Standing::Mismatch(theirs),
            _ => wait_on(last, false),
        },
        Mode::Shared => match mode_of(first) {
            theirs @ Mode::Holders(_) => Standing::Mismatch(theirs),
            _ => match before
                .iter()
                .rev()
                .find(|kv| mode_of(kv) == Mode::Exclusive)
            {
                Some(exclusive) => wait_on(exclusive, false),
                None => Standing::Holds,
            },
        },
        Mode::Holders(n) => {
            let theirs = mode_of(first);
            if theirs != ours {
                return Standing::Mismatch(theirs);
            }
            match before.len() {
                len if len < n as usize => Standing::Holds,
                len if len == n as usize => Standing::Waits(Awaited::AnyDelete),
                _ => wait_on(last, true),
            }
        }
    }
}

/// The holders among `line` (every key under `NAME/`, in arrival order), as the first key's
/// mode says: the first key alone, the shared keys at the head, or a semaphore's N first.
pub fn holders(line: &[Kv]) -> (Mode, &[Kv]) {
    let Some(first) = line.first() else {
        return (Mode::Exclusive, line);
    };
    let mode = mode_of(first);
    let count = match mode {
        Mode::Exclusive => 1,
        Mode::Shared => line.iter().take_while(|kv| mode_of(kv) == mode).count(),
        Mode::Holders(n) => line
            .iter()
            .take(n as usize)
            .take_while(|kv| mode_of(kv) == mode)
            .count(),
    };
    (mode, &line[..count])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kv(key: &str, value: &str) -> Kv {
        Kv {
            key: key.into(),
            create_revision: 0,
            lease: 1,
            value: value.as_bytes().to_vec(),
        }
    }

    fn line(modes: &str) -> Vec<Kv> {
        modes
            .chars()
            .enumerate()
            .map(|(i, m)| match m {
                's' => kv(&format!("k{i}"), r#"{"mode":"shared"}"#),
                'x' => kv(&format!("k{i}"), r#"{"mode":"exclusive"}"#),
                'e' => kv(&format!("k{i}"), ""),
                '2' => kv(&format!("k{i}"), r#"{"mode":"holders","limit":2}"#),
                '3' => kv(&format!("k{i}"), r#"{"mode":"holders","limit":3}"#),
                _ => unreachable!(),
            })
            .collect()
    }

    fn on(key: &str, puts: bool) -> Standing {
        Standing::Waits(Awaited::Key {
            key: key.into(),
            puts,
        })
    }

    #[test]
    fn modes_are_read_from_values_and_etcdctls_empty_value_is_exclusive() {
        let modes: Vec<Mode> = line("sxe2").iter().map(mode_of).collect();
        assert_eq!(
            modes,
            [
                Mode::Shared,
                Mode::Exclusive,
                Mode::Exclusive,
                Mode::Holders(2)
            ]
        );
        for mode in [Mode::Shared, Mode::Exclusive, Mode::Holders(7)] {
            let (name, limit) = mode_fields(mode);
            let value = serde_json::json!({"mode": name, "limit": limit}).to_string();
            assert_eq!(mode_of(&kv("k", &value)), mode);
        }
    }

    #[test]
    fn an_exclusive_run_holds_first_and_waits_on_the_key_before_its_own() {
        assert_eq!(standing(Mode::Exclusive, &[]), Standing::Holds);
        assert_eq!(standing(Mode::Exclusive, &line("ss")), on("k1", false));
        assert_eq!(standing(Mode::Exclusive, &line("e")), on("k0", false));
        assert_eq!(
            standing(Mode::Exclusive, &line("2")),
            Standing::Mismatch(Mode::Holders(2))
        );
    }

    #[test]
    fn shared_runs_hold_together_until_an_exclusive_one_is_before_them() {
        assert_eq!(standing(Mode::Shared, &line("sss")), Standing::Holds);
        // Behind a queued exclusive run: never past it, woken when it goes.
        assert_eq!(standing(Mode::Shared, &line("ssxs")), on("k2", false));
        assert_eq!(standing(Mode::Shared, &line("xsxss")), on("k2", false));
        // etcdctl's keys are exclusive.
        assert_eq!(standing(Mode::Shared, &line("e")), on("k0", false));
        assert_eq!(
            standing(Mode::Shared, &line("2s")),
            Standing::Mismatch(Mode::Holders(2))
        );
    }

    #[test]
    fn a_key_of_another_mode_behind_the_first_is_on_its_way_out_and_refuses_nobody() {
        // Its run found the first key of another mode and is leaving: a shared run holds
        // beside the shared holder, a semaphore's run counts it as a place for an instant.
        assert_eq!(standing(Mode::Shared, &line("s2")), Standing::Holds);
        assert_eq!(standing(Mode::Shared, &line("x2")), on("k0", false));
        assert_eq!(
            standing(Mode::Holders(2), &line("23")),
            Standing::Waits(Awaited::AnyDelete)
        );
        assert_eq!(standing(Mode::Holders(2), &line("2e2")), on("k2", true));
        assert_eq!(
            standing(Mode::Holders(3), &line("2s")),
            Standing::Mismatch(Mode::Holders(2))
        );
    }

    #[test]
    fn a_semaphores_first_waiter_waits_for_any_delete_and_the_next_for_its_predecessor() {
        let n = Mode::Holders(2);
        assert_eq!(standing(n, &line("2")), Standing::Holds);
        assert_eq!(
            standing(n, &line("22")),
            Standing::Waits(Awaited::AnyDelete)
        );
        assert_eq!(standing(n, &line("2222")), on("k3", true));
        assert_eq!(
            standing(n, &line("32")),
            Standing::Mismatch(Mode::Holders(3))
        );
        assert_eq!(standing(n, &line("e")), Standing::Mismatch(Mode::Exclusive));
        assert_eq!(standing(n, &line("s")), Standing::Mismatch(Mode::Shared));
    }

    #[test]
    fn the_holders_are_told_by_the_first_keys_mode() {
        let shared = line("ssxs");
        assert_eq!(holders(&shared), (Mode::Shared, &shared[..2]));
        let semaphore = line("2222");
        assert_eq!(holders(&semaphore), (Mode::Holders(2), &semaphore[..2]));
        let exclusive = line("es");
        assert_eq!(holders(&exclusive), (Mode::Exclusive, &exclusive[..1]));
        assert_eq!(holders(&[]).1.len(), 0);
    }
}
