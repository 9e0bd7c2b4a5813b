//! What the lock scripts answer, read: an attempt's grant, busy or queued reply, the holder a
//! reply describes, a key's expiry, a yes-or-no.

use std::time::Duration;

use crate::backend::{Attempt, Busy, Expiry, Holder, Mode};
use crate::redis::resp::Reply;

pub(super) fn expiry(pttl: i64) -> Expiry {
    if pttl < 0 {
        Expiry::Never
    } else {
        Expiry::In(Duration::from_millis(pttl as u64))
    }
}

pub(super) fn parse_attempt(reply: &Reply) -> Option<Attempt> {
    let items = reply.items();
    match items.first()?.as_int()? {
        1 => Some(Attempt::Acquired {
            fence: u64::try_from(items.get(1)?.as_int()?).ok()?,
        }),
        0 => Some(Attempt::Busy(Busy {
            holder: holder_at(items),
            expiry: expiry(items.get(1)?.as_int()?),
        })),
        -1 => Some(Attempt::Mismatch {
            theirs: match items.get(1)?.as_text()?.as_str() {
                "shared" => Mode::Shared,
                n => Mode::of_holders(n.parse().ok()?),
            },
        }),
        2 => Some(Attempt::Busy(Busy {
            holder: Holder::default(),
            expiry: Expiry::Queued {
                retry_in: Duration::from_millis(u64::try_from(items.get(1)?.as_int()?).ok()?),
                ahead: u32::try_from(items.get(2)?.as_int()?).ok()?,
            },
        })),
        _ => None,
    }
}

/// The holder the scripts describe in items 2 to 6 of their reply: host, pid, command, since,
/// fence (each nil when the holder is not a `locked-run`).
fn holder_at(items: &[Reply]) -> Holder {
    let text = |i: usize| items.get(i).and_then(Reply::as_text);
    holder(text(2), text(3), text(4), text(5), text(6))
}

/// A holder from the fields the scripts and the holder hash keep as text (nil: not known).
pub(super) fn holder(
    host: Option<String>,
    pid: Option<String>,
    command: Option<String>,
    since: Option<String>,
    fence: Option<String>,
) -> Holder {
    // Written by whoever wrote the holder's record: kept as it is, and shown in the printable
    // form (the holder's `Display`; JSON escapes it by construction).
    Holder {
        host: host.as_deref().map(unfield),
        pid: pid.and_then(|p| p.parse().ok()),
        command: command.as_deref().map(unfield),
        since_ms: since.and_then(|s| s.parse().ok()),
        fence: fence.and_then(|f| f.parse().ok()),
    }
}

/// A name (host, program) as a holder's metadata keeps it, raw but for two characters: a
/// semaphore's metadata is one string of tab-separated fields, so the tab is written `\t` and
/// the backslash `\\`; cut to a name's length.
pub(super) fn field(name: &str) -> String {
    crate::text::cut(name, crate::text::MAX_NAME)
        .replace('\\', "\\\\")
        .replace('\t', "\\t")
}

/// A name as [`field`] wrote it, read back; a backslash before anything else stays (metadata
/// of the previous release, which kept the printable form).
fn unfield(text: &str) -> String {
    let mut name = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match (c, chars.peek()) {
            ('\\', Some('\\')) => name.push('\\'),
            ('\\', Some('t')) => name.push('\t'),
            _ => {
                name.push(c);
                continue;
            }
        }
        chars.next();
    }
    name
}

/// Whether an attempt's busy or queued reply says it holds a place in the queue (its last
/// item; a grant never does).
pub(super) fn queued(reply: &Reply) -> bool {
    let items = reply.items();
    let at = match items.first().and_then(Reply::as_int) {
        Some(0) => 7,
        Some(2) => 3,
        _ => return false,
    };
    items.get(at).and_then(Reply::as_int) == Some(1)
}

pub(super) fn as_flag(reply: &Reply) -> Option<bool> {
    reply.as_int().map(|i| i == 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 43's review: a holder's names are kept raw (every backend shows the same text in
    /// `status --json`), a tab and a backslash escaped only so a semaphore's fields stay apart.
    #[test]
    fn names_are_kept_raw_and_read_back() {
        for name in ["web-1", "w\u{1b}]0;x\u{7}", "a\tb\\t\\", "\\u{1b}", ""] {
            assert_eq!(unfield(&field(name)), name);
            assert!(!field(name).contains('\t'), "{name:?}");
        }
        assert_eq!(field(&"é".repeat(1000)).chars().count(), 255);
        // The previous release's printable form stays as it was.
        assert_eq!(unfield("w\\u{1b}"), "w\\u{1b}");
    }

    fn bulk(s: &str) -> Reply {
        Reply::Bulk(Some(s.as_bytes().to_vec()))
    }

    #[test]
    fn parses_a_grant() {
        let reply = Reply::Array(Some(vec![Reply::Int(1), Reply::Int(42)]));
        assert_eq!(parse_attempt(&reply), Some(Attempt::Acquired { fence: 42 }));
    }

    #[test]
    fn parses_a_busy_reply_with_and_without_metadata() {
        let reply = Reply::Array(Some(vec![
            Reply::Int(0),
            Reply::Int(1500),
            bulk("web-3"),
            bulk("77"),
            bulk("backup.sh"),
            bulk("1764673200000"),
            bulk("9"),
        ]));
        let Some(Attempt::Busy(busy)) = parse_attempt(&reply) else {
            panic!("not busy")
        };
        assert_eq!(busy.expiry, Expiry::In(Duration::from_millis(1500)));
        assert_eq!(busy.holder.host.as_deref(), Some("web-3"));
        assert_eq!(busy.holder.pid, Some(77));
        assert_eq!(busy.holder.fence, Some(9));

        let foreign = Reply::Array(Some(vec![
            Reply::Int(0),
            Reply::Int(-1),
            Reply::Bulk(None),
            Reply::Bulk(None),
        ]));
        let Some(Attempt::Busy(busy)) = parse_attempt(&foreign) else {
            panic!("not busy")
        };
        assert_eq!(busy.expiry, Expiry::Never);
        assert!(!busy.holder.is_known());
    }
}
