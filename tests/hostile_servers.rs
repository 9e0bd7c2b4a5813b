//! Hostile Redis servers: every reply of every backend is bounded in size and time (DESIGN,
//! "Every reply is bounded"). A fake Redis server sends an endless bulk string or array, a
//! `$-5`. A run and `status` must end as an unreachable server would (69 before the command
//! starts), well within the request's deadline, with one line that says the reply was too
//! large or malformed (never that it was late), and with a peak resident memory far below what
//! the reply announced (measured by GNU time), its address space capped at 512 MiB. etcd's
//! are in `etcd_hostile.rs`.
//!
//! See: issue 35, item 2 (a run peaked at 2.4 to 6 GB, then said "no answer in time").

use crate::support::hostile::{self, Hostile, both_refuse};

#[test]
fn an_endless_redis_bulk_string_is_refused_at_its_header() {
    let server = Hostile::start(hostile::endless_bulk);
    both_refuse(
        &server.redis_url(),
        "sent a reply too large: a reply longer than the 16 MiB",
    );
}

#[test]
fn an_endless_redis_array_is_refused_at_its_header() {
    let server = Hostile::start(hostile::endless_array);
    both_refuse(
        &server.redis_url(),
        "sent a reply too large: an aggregate of 99999999999 entries",
    );
}

/// See: issue 35, item 5: `$-5` was read as a nil, then the run waited for the rest until its
/// deadline, and said the server "did not answer within 1.5s".
#[test]
fn a_redis_length_of_minus_5_is_malformed_not_late() {
    let server = Hostile::start(hostile::negative_length);
    both_refuse(
        &server.redis_url(),
        "sent a malformed reply: a length of -5",
    );
}
