//! Redlock's arithmetic without servers: the quorum, a renewal round's tally, what `status`
//! makes of N servers' reports, and which holder a waiter names. The protocol itself (grants,
//! the fence's two phases, losses) is tested against real servers in tests/redlock.rs.

use super::*;
use crate::backend::{Holder, Slot};
use crate::name::LockName;
use crate::redis::node::Node;

/// A Redlock on `n` servers that are never connected to (opening a node does not connect).
fn redlock_on(n: u16) -> Redlock {
    let name = LockName::new("job").unwrap();
    let locks = (0..n)
        .map(|i| {
            let url = format!("redis://127.0.0.1:{}", 7000 + i);
            let node = Node::open(&url, Duration::from_secs(1), None).unwrap();
            ServerLock::on(node, name.clone(), "test")
        })
        .collect();
    Redlock::new(locks, Duration::from_millis(100))
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn holder(host: &str, pid: u32) -> Holder {
    Holder {
        host: Some(host.into()),
        pid: Some(pid),
        command: Some("backup.sh".into()),
        since_ms: Some(1_764_673_200_000),
        fence: Some(1),
    }
}

fn busy(holder: Holder, expiry: Expiry) -> Busy {
    Busy { holder, expiry }
}

/// One server's report of a lock held with `value` by `holder`, its lease `left`.
fn holding(value: &str, holder: Holder, left: Expiry, fence: u64) -> Report {
    Report {
        fence: Some(fence),
        held: Some(busy(holder, left)),
        value: Some(value.into()),
        ..Report::default()
    }
}

fn free(fence: Option<u64>) -> Report {
    Report {
        fence,
        ..Report::default()
    }
}

#[test]
fn a_quorum_is_a_strict_majority() {
    for (n, quorum, may_fail) in [(3, 2, 1), (4, 3, 1), (5, 3, 2), (6, 4, 2), (7, 4, 3)] {
        let redlock = redlock_on(n);
        assert_eq!(redlock.servers(), n as usize);
        assert_eq!(redlock.quorum(), quorum, "{n} servers");
        assert_eq!(
            redlock.servers() - redlock.quorum(),
            may_fail,
            "{n} servers"
        );
        // Any two quorums share a server: what the fence's monotonicity rests on.
        assert!(2 * redlock.quorum() > redlock.servers(), "{n} servers");
    }
}

#[test]
fn every_server_of_a_redlock_has_its_token() {
    let redlock = redlock_on(5);
    assert!(redlock.locks.iter().all(|l| l.token() == redlock.token()));
    assert_eq!(redlock.locks[0].name().as_str(), "job");
    assert_eq!(redlock.fence.get(), 0, "no fence before an acquisition");
}

#[test]
fn a_tally_counts_ours_not_ours_and_failed() {
    assert_eq!(Tally::of(&[]), Tally::default());
    let answers = [
        Some(Ok(Here::Ours)),
        None, // still on its way: not counted
        Some(Ok(Here::Absent)),
        Some(Err(BackendError::Transient("timed out".into()))),
        Some(Ok(Here::Ours)),
        Some(Ok(Here::Other)),
        Some(Err(BackendError::Refused("NOPERM".into()))),
        None,
    ];
    let tally = Tally::of(&answers);
    assert_eq!(
        tally,
        Tally {
            ours: 2,
            not_ours: 2,
            failed: 2
        },
        "absent and another owner's are both not ours"
    );
    assert_eq!(tally.against(), 4, "not ours, and failed");
    assert_eq!(Tally::of(&[None, None]), Tally::default());
}

/// Every way N servers can answer a renewal round: once all have answered, either a quorum is
/// ours or more than N - quorum are against it, never both and never neither; while some are
/// still on their way, both cannot be true at once.
#[test]
fn a_complete_round_is_either_a_quorum_or_lost_never_both() {
    let kinds: [Option<Result<Here, BackendError>>; 4] = [
        None,
        Some(Ok(Here::Ours)),
        Some(Ok(Here::Absent)),
        Some(Err(BackendError::Transient("reset".into()))),
    ];
    for n in 3..=6u16 {
        let quorum = redlock_on(n).quorum();
        let n = n as usize;
        let mut rounds = 0;
        for mut code in 0..kinds.len().pow(n as u32) {
            let answers: Vec<_> = (0..n)
                .map(|_| {
                    let kind = kinds[code % kinds.len()].clone();
                    code /= kinds.len();
                    kind
                })
                .collect();
            let tally = Tally::of(&answers);
            let answered = answers.iter().filter(|a| a.is_some()).count();
            assert_eq!(tally.ours + tally.against(), answered, "{answers:?}");
            let renewed = tally.ours >= quorum;
            let lost = tally.against() > n - quorum;
            assert!(!(renewed && lost), "n = {n}: {answers:?}");
            if answered == n {
                assert!(renewed || lost, "n = {n}, undecided: {answers:?}");
                rounds += 1;
            }
        }
        assert_eq!(rounds, 3usize.pow(n as u32));
    }
}

/// Held when a quorum holds one value, until the quorum-th longest of those servers' leases.
#[test]
fn held_until_the_quorum_th_longest_lease_of_the_owner_s_servers() {
    let a = holder("web-1", 11);
    let reports = [
        holding("a", a.clone(), Expiry::In(ms(4000)), 3),
        holding("a", a.clone(), Expiry::In(ms(1000)), 3),
        holding("b", holder("web-2", 22), Expiry::In(ms(9000)), 9),
        holding("a", a.clone(), Expiry::In(ms(3000)), 3),
        holding("a", a.clone(), Expiry::In(ms(2000)), 3),
    ];
    let answered: Vec<&Report> = reports.iter().collect();
    let summary = summarize(&answered, 3);
    let held = summary.held.clone().expect("a quorum holds a's value");
    // a's leases, longest first: 4000, 3000, 2000, 1000; three servers hold it for 2000 ms
    // more (b's longer lease on another server counts for nothing).
    assert_eq!(held.expiry, Expiry::In(ms(2000)));
    assert_eq!(held.holder, a);
    assert_eq!(summary.value.as_deref(), Some("a"));
    assert_eq!(summary.fence, Some(9), "the last fence any server issued");
    assert_eq!(
        summary.holders,
        [Slot {
            token: Some("a".into()),
            busy: held
        }]
    );
    assert_eq!(summary.limit, Some(1));
    assert_eq!(
        summary.servers, None,
        "inspect sets the quorum and the servers"
    );

    // With a quorum of 4 the fourth longest: 1000 ms.
    let summary = summarize(&answered, 4);
    assert_eq!(summary.held.unwrap().expiry, Expiry::In(ms(1000)));
}

#[test]
fn a_lease_without_expiry_counts_as_the_longest() {
    let a = holder("web-1", 11);
    let reports = [
        holding("a", a.clone(), Expiry::In(ms(500)), 1),
        holding("a", a.clone(), Expiry::Never, 1),
        holding("a", a.clone(), Expiry::In(ms(700)), 1),
    ];
    let answered: Vec<&Report> = reports.iter().collect();
    assert_eq!(
        summarize(&answered, 2).held.unwrap().expiry,
        Expiry::In(ms(700))
    );
    assert_eq!(summarize(&answered, 1).held.unwrap().expiry, Expiry::Never);
}

#[test]
fn no_owner_on_a_quorum_is_free_with_the_largest_fence_and_waiters() {
    let reports = [
        holding("a", holder("web-1", 11), Expiry::In(ms(4000)), 5),
        holding("a", holder("web-1", 11), Expiry::In(ms(4000)), 5),
        holding("b", holder("web-2", 22), Expiry::In(ms(4000)), 6),
        holding("b", holder("web-2", 22), Expiry::In(ms(4000)), 6),
        free(Some(2)),
    ];
    let mut reports = reports.to_vec();
    reports[1].waiters = Some(1);
    reports[4].waiters = Some(3);
    let answered: Vec<&Report> = reports.iter().collect();
    let summary = summarize(&answered, 3);
    assert_eq!(summary.held, None, "a split vote: nobody holds a quorum");
    assert_eq!(summary.value, None);
    assert!(summary.holders.is_empty());
    assert_eq!(summary.limit, None);
    assert_eq!(summary.fence, Some(6));
    assert_eq!(summary.waiters, Some(3), "the most any server counts");

    // Free everywhere, and never used: no fence, and no count of waiters.
    let reports = [free(None), free(None), free(None)];
    let answered: Vec<&Report> = reports.iter().collect();
    assert_eq!(summarize(&answered, 2), Report::default());
}

#[test]
fn the_holder_shown_is_the_first_known_among_the_owner_s_servers() {
    let a = holder("web-1", 11);
    let reports = [
        // Another program's value on this server only: not the owner's.
        holding("x", holder("web-9", 99), Expiry::In(ms(100)), 1),
        // The owner's value, but its metadata lapsed here.
        holding("a", Holder::default(), Expiry::In(ms(900)), 1),
        holding("a", a.clone(), Expiry::In(ms(800)), 1),
        holding("a", holder("web-1", 12), Expiry::In(ms(700)), 1),
    ];
    let answered: Vec<&Report> = reports.iter().collect();
    let held = summarize(&answered, 3).held.unwrap();
    assert_eq!(held.holder, a);
    assert_eq!(held.expiry, Expiry::In(ms(700)));

    // The owner's servers carry no metadata at all (another program's lock): held, by nobody
    // known.
    let reports = [
        holding("x", Holder::default(), Expiry::In(ms(100)), 1),
        holding("x", Holder::default(), Expiry::In(ms(200)), 1),
    ];
    let answered: Vec<&Report> = reports.iter().collect();
    let held = summarize(&answered, 2).held.unwrap();
    assert_eq!(held.holder, Holder::default());
}

#[test]
fn a_value_held_without_a_lease_report_expires_at_once() {
    // A quorum holds the value, but fewer than a quorum report a lease on it.
    let mut reports = vec![holding("a", holder("web-1", 11), Expiry::In(ms(900)), 1)];
    for _ in 0..2 {
        reports.push(Report {
            value: Some("a".into()),
            ..Report::default()
        });
    }
    let answered: Vec<&Report> = reports.iter().collect();
    let held = summarize(&answered, 3).held.unwrap();
    assert_eq!(held.expiry, Expiry::In(Duration::ZERO));
    assert_eq!(held.holder, holder("web-1", 11));
}

#[test]
fn the_same_owner_is_one_process_on_one_host() {
    let a = holder("web-1", 11);
    let mut later = a.clone();
    later.since_ms = Some(1_764_673_200_500);
    later.fence = Some(2);
    later.command = None;
    assert!(
        same_owner(&a, &later),
        "since, fence and command may differ"
    );
    assert!(!same_owner(&a, &holder("web-1", 12)), "another pid");
    assert!(!same_owner(&a, &holder("web-2", 11)), "another host");
    assert!(
        same_owner(&Holder::default(), &Holder::default()),
        "holders without metadata cannot be told apart"
    );
    assert!(!same_owner(&a, &Holder::default()));
}

#[test]
fn the_most_common_holder_is_the_one_most_servers_report() {
    let in_1s = Expiry::In(ms(1000));
    assert_eq!(most_common_holder(&[]), Holder::default());

    let (a, b) = (holder("web-1", 11), holder("web-2", 22));
    let mut a_later = a.clone();
    a_later.fence = Some(7);
    let reported = [
        busy(b.clone(), in_1s),
        busy(a.clone(), in_1s),
        busy(b.clone(), in_1s),
        busy(a_later, in_1s),
        busy(a.clone(), in_1s),
    ];
    assert_eq!(
        most_common_holder(&reported),
        a,
        "three servers report a (as the first of them tells it), two b"
    );

    // A tie: the first reported.
    let tie = [busy(b.clone(), in_1s), busy(a.clone(), in_1s)];
    assert_eq!(most_common_holder(&tie), b);

    // Holders without metadata count as one.
    let foreign = [
        busy(Holder::default(), in_1s),
        busy(a.clone(), in_1s),
        busy(Holder::default(), Expiry::Never),
    ];
    assert_eq!(most_common_holder(&foreign), Holder::default());
}

/// `gather` stops as soon as the outcome is known, and drops the answers still on their way.
#[tokio::test(start_paused = true)]
async fn a_round_ends_when_its_outcome_is_known() {
    let delays = [30, 10, 20, 40];
    let outputs = gather(
        delays.iter().map(|&d| async move {
            tokio::time::sleep(ms(d)).await;
            d
        }),
        |outputs| {
            if outputs.iter().flatten().count() >= 2 {
                Outcome::Known
            } else {
                Outcome::Pending
            }
        },
    )
    .await;
    assert_eq!(outputs, [None, Some(10), Some(20), None]);
}

/// Once the outcome is known with a grace, the others get that long to answer, no longer.
#[tokio::test(start_paused = true)]
async fn a_known_round_waits_out_its_grace_for_the_others() {
    let started = tokio::time::Instant::now();
    let delays = [10, 25, 500, 35];
    let outputs = gather(
        delays.iter().map(|&d| async move {
            tokio::time::sleep(ms(d)).await;
            d
        }),
        |outputs| {
            if outputs.iter().flatten().count() >= 1 {
                Outcome::KnownAfter(ms(30))
            } else {
                Outcome::Pending
            }
        },
    )
    .await;
    // Known at 10 ms: the answers by 40 ms are kept, the one at 500 ms is not waited for.
    assert_eq!(outputs, [Some(10), Some(25), None, Some(35)]);
    assert_eq!(started.elapsed(), ms(40));

    // Every answer in before the outcome is known: the round ends with the last.
    let outputs = gather([ms(5), ms(6)].into_iter().map(tokio::time::sleep), |_| {
        Outcome::Pending
    })
    .await;
    assert_eq!(outputs, [Some(()), Some(())]);
}
