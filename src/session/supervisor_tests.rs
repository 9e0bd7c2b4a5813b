//! The supervisor under paused time, against a fake job and a backend with scripted renewals:
//! each test pins, to the millisecond, what the job is sent, when the lock is renewed and
//! released, what becomes of the watchers, and how the run ends, in one of the races that real
//! processes reach only by chance. T = 30 s, R = 5 s, K = 10 s, D = 302 ms: a grant at 0 is
//! valid until V = 29 698 ms, its kill signal is due at 19 396 ms and its SIGKILL at 29 396 ms.

use std::cell::RefCell;
use std::time::Duration;

use nix::sys::signal::Signal::{SIGINT, SIGKILL, SIGTERM};

use crate::backend::{Attempt, BackendError, Busy, Expiry, Holder};
use crate::lease::{LeaseClock, Timings};
use crate::plumbing::exit::{Exit, Failure};
use crate::session::config::{Patience, RunConfig};

use super::fake::{Answer, Fake, TestClock, after, config};
use super::fake_job::{FakeJob, MAIN, Proc, Sent, WATCHER, Watched};
use super::record::Held;
use super::run::hold;
use super::waiter::Acquired;

/// A renewal answered "still ours" `ms` after it was sent.
fn ours(ms: u64) -> Answer {
    after(ms, Ok(Attempt::Acquired { fence: 1 }))
}

/// A renewal answered "no longer ours" `ms` after it was sent.
fn not_ours(ms: u64) -> Answer {
    let busy = Busy {
        holder: Holder::default(),
        expiry: Expiry::In(Duration::from_secs(30)),
    };
    after(ms, Ok(Attempt::Busy(busy)))
}

/// Renewals that are never answered (each times out), `n` of them.
fn unanswered(n: usize) -> Vec<Answer> {
    let lost = || BackendError::Transient("no answer".into());
    (0..n).map(|_| Answer(Err(lost()), None)).collect()
}

/// Runs `job` under a lock granted at 0 by `fake`, from its start to the run's end.
async fn hold_job(fake: &Fake, cfg: &RunConfig, job: &FakeJob) -> Result<Exit, Failure> {
    let clock = TestClock::new();
    let acquired = Acquired {
        fence: 1,
        sent: Duration::ZERO,
        waited: Duration::ZERO,
    };
    let lease = RefCell::new(LeaseClock::new(cfg.timings, acquired.sent));
    let held = Held {
        acquired: &acquired,
        started_ms: 0,
        user: "tester".into(),
    };
    hold(
        &clock,
        fake,
        cfg,
        &held,
        &lease,
        job.job(),
        &mut job.events(),
        &mut None,
    )
    .await
}

fn lost(result: Result<Exit, Failure>) -> String {
    let failure = result.expect_err("76");
    assert_eq!(failure.exit, Exit::Lost, "{}", failure.message);
    failure.message
}

// Lease loss during the sweep.

#[tokio::test(start_paused = true)]
async fn a_loss_during_the_sweep_sends_the_kill_signal_at_once_and_the_sweeps_sigkill_stands() {
    // The command exits at 1 s and leaves a process that ignores SIGTERM: the sweep sends it
    // SIGTERM after the 100 ms settle, SIGKILL K later. The renewal at 5 s says "not ours".
    let job = FakeJob::new(Proc::new("job").exits_at(1_000, 0))
        .leaving(Proc::new("backupd").only_sigkill());
    let fake = Fake::new(vec![]).renewing(vec![not_ours(10)]);
    let cfg = config(Patience::Forever);
    let message = lost(hold_job(&fake, &cfg, &job).await);
    assert_eq!(
        job.sent(),
        [
            (1_100, Sent::Terminate(SIGTERM)),
            (5_010, Sent::Terminate(SIGTERM)),
            (11_100, Sent::Signal(SIGKILL)),
        ],
        "the loss's own SIGKILL (15 010) is not waited for, nor is it needed"
    );
    assert_eq!(
        fake.renewals(),
        [5_000],
        "none once the lock is no longer ours"
    );
    assert_eq!(fake.released(), [11_100], "only once nothing is left");
    assert!(
        message.contains("no longer ours") && message.contains("(it exited with status 0)"),
        "{message}"
    );
}

#[tokio::test(start_paused = true)]
async fn renewals_that_fail_during_the_sweep_send_the_kill_signal_at_v_minus_d_minus_k() {
    // Renewed at 5 s (V = 34 698: kill signal due at 24 396); from 10 s on no renewal is
    // answered. The command exits at 15 s, leaving a process that ignores SIGTERM.
    let job = FakeJob::new(Proc::new("job").exits_at(15_000, 0))
        .leaving(Proc::new("backupd").only_sigkill());
    let mut renewals = vec![ours(1)];
    renewals.extend(unanswered(20));
    let fake = Fake::new(vec![]).renewing(renewals);
    let cfg = config(Patience::Forever);
    let message = lost(hold_job(&fake, &cfg, &job).await);
    assert_eq!(
        job.sent(),
        [
            (15_100, Sent::Terminate(SIGTERM)),
            (24_396, Sent::Terminate(SIGTERM)),
            (25_100, Sent::Signal(SIGKILL)),
        ]
    );
    // Each attempt times out after R/2 and is retried after a back-off of 20 ms, doubling:
    // the lease is kept through the sweep as while the command ran.
    assert_eq!(
        fake.renewals(),
        [5_000, 10_000, 12_520, 15_060, 17_640, 20_300, 23_120]
    );
    assert_eq!(fake.released(), [25_100]);
    assert!(
        message.contains("could not be renewed (no answer within 2.5s)"),
        "{message}"
    );
}

/// Issue 45's review: after a lost lease with the server stopped, the release spent its whole
/// timeout (5 s) on it, and the run's end (76) came that late. It is tried no longer than the
/// lease may live on the server (V + 2D), at least 100 ms; without a loss, the whole timeout.
#[tokio::test(start_paused = true)]
async fn after_a_loss_the_release_is_tried_no_longer_than_the_lease_may_live() {
    let job = FakeJob::new(Proc::new("job").only_sigkill());
    let mut renewals = vec![ours(1)];
    renewals.extend(unanswered(40));
    let fake = Fake::new(vec![]).renewing(renewals);
    let mut cfg = config(Patience::Forever);
    cfg.timings = Timings::new(Duration::from_secs(2), None, None).unwrap();
    lost(hold_job(&fake, &cfg, &job).await);
    let given = fake.release_timeouts();
    assert_eq!(given.len(), 1);
    let d = cfg.timings.drift;
    // Killed at V - D; the release asked for at V - D at the earliest.
    assert!(
        given[0] <= 3 * d + Duration::from_millis(100) && given[0] < cfg.release_timeout,
        "{given:?}, D = {d:?}"
    );

    let fake = Fake::new(vec![]);
    let job = FakeJob::new(Proc::new("job").exits_at(1_000, 0));
    hold_job(&fake, &cfg, &job).await.unwrap();
    assert_eq!(fake.release_timeouts(), [cfg.release_timeout]);
}

#[tokio::test(start_paused = true)]
async fn what_the_command_leaves_is_waited_for_and_then_the_lock_released() {
    // The process left behind takes 2 s to exit on SIGTERM; its SIGCHLD ends the sweep.
    let job = FakeJob::new(Proc::new("job").exits_at(1_000, 3))
        .leaving(Proc::new("flush").exits_after_signal(2_000, 0));
    let fake = Fake::new(vec![]);
    let cfg = config(Patience::Forever);
    let exit = hold_job(&fake, &cfg, &job).await;
    assert_eq!(exit, Ok(Exit::Child(3)), "the command's own status");
    assert_eq!(job.sent(), [(1_100, Sent::Terminate(SIGTERM))]);
    assert_eq!(fake.released(), [3_100]);
}

// Signals during a stop.

#[tokio::test(start_paused = true)]
async fn a_signal_during_a_lease_loss_stop_is_passed_on_and_moves_no_deadline() {
    // Lost at 5 010 (kill signal; SIGKILL due at 15 010). SIGTERM and SIGINT sent to
    // locked-run meanwhile reach the command, which ignores them; SIGKILL comes on time.
    let job = FakeJob::new(Proc::new("job").only_sigkill())
        .signalled_at(8_000, SIGTERM)
        .signalled_at(12_000, SIGINT);
    let fake = Fake::new(vec![]).renewing(vec![not_ours(10)]);
    let cfg = config(Patience::Forever);
    let message = lost(hold_job(&fake, &cfg, &job).await);
    assert_eq!(
        job.sent(),
        [
            (5_010, Sent::Terminate(SIGTERM)),
            (8_000, Sent::Forward(SIGTERM)),
            (12_000, Sent::Forward(SIGINT)),
            (15_010, Sent::Signal(SIGKILL)),
        ]
    );
    assert_eq!(fake.released(), [15_010]);
    assert!(
        message.contains("stopped it with SIGTERM (it was ended by SIGKILL)"),
        "{message}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_forwarded_signal_starts_no_timer_of_its_own() {
    // The sender escalates (systemd, a CI runner), not locked-run: no SIGKILL K later.
    let job = FakeJob::new(Proc::new("job").only_sigkill().exits_at(19_000, 0))
        .signalled_at(1_000, SIGTERM);
    let fake = Fake::new(vec![]);
    let cfg = config(Patience::Forever);
    let exit = hold_job(&fake, &cfg, &job).await;
    assert_eq!(exit, Ok(Exit::Child(0)));
    assert_eq!(job.sent(), [(1_000, Sent::Forward(SIGTERM))]);
    assert_eq!(fake.renewals(), [5_000, 10_000, 15_000]);
    assert_eq!(fake.released(), [19_000]);
}

#[tokio::test(start_paused = true)]
async fn a_signal_during_the_sweep_is_passed_on_and_moves_no_deadline() {
    // One signal in the settle, one after the sweep's kill signal.
    let job = FakeJob::new(Proc::new("job").exits_at(1_000, 0))
        .leaving(Proc::new("backupd").only_sigkill())
        .signalled_at(1_050, SIGINT)
        .signalled_at(3_000, SIGTERM);
    let fake = Fake::new(vec![]);
    let cfg = config(Patience::Forever);
    let exit = hold_job(&fake, &cfg, &job).await;
    assert_eq!(exit, Ok(Exit::Child(0)));
    assert_eq!(
        job.sent(),
        [
            (1_050, Sent::Forward(SIGINT)),
            (1_100, Sent::Terminate(SIGTERM)),
            (3_000, Sent::Forward(SIGTERM)),
            (11_100, Sent::Signal(SIGKILL)),
        ]
    );
    assert_eq!(fake.released(), [11_100]);
}

// --max-run racing a loss: whichever stop began first explains the ending.

#[tokio::test(start_paused = true)]
async fn max_run_then_a_loss_is_124_and_the_max_run_sigkill_stands() {
    let job = FakeJob::new(Proc::new("job").only_sigkill());
    let fake = Fake::new(vec![]).renewing(vec![ours(1), not_ours(10)]);
    let mut cfg = config(Patience::Forever);
    cfg.max_run = Some(Duration::from_secs(8));
    let failure = hold_job(&fake, &cfg, &job).await.expect_err("124");
    assert_eq!(failure.exit, Exit::TimedOut, "{}", failure.message);
    assert!(
        failure.message.contains("--max-run 8s"),
        "{}",
        failure.message
    );
    // The loss at 10 010 sends its kill signal too; its SIGKILL (20 010) is not needed.
    assert_eq!(
        job.sent(),
        [
            (8_000, Sent::Terminate(SIGTERM)),
            (10_010, Sent::Terminate(SIGTERM)),
            (18_000, Sent::Signal(SIGKILL)),
        ]
    );
    assert_eq!(fake.renewals(), [5_000, 10_000]);
    assert_eq!(fake.released(), [18_000]);
}

#[tokio::test(start_paused = true)]
async fn a_loss_then_max_run_is_76_and_max_run_sends_nothing() {
    let job = FakeJob::new(Proc::new("job").only_sigkill());
    let fake = Fake::new(vec![]).renewing(vec![not_ours(10)]);
    let mut cfg = config(Patience::Forever);
    cfg.max_run = Some(Duration::from_secs(8));
    let message = lost(hold_job(&fake, &cfg, &job).await);
    assert!(message.contains("no longer ours"), "{message}");
    assert_eq!(
        job.sent(),
        [
            (5_010, Sent::Terminate(SIGTERM)),
            (15_010, Sent::Signal(SIGKILL)),
        ],
        "nothing at 8 000 or 18 000"
    );
    assert_eq!(fake.released(), [15_010]);
}

// The command's exit racing a renewal.

#[tokio::test(start_paused = true)]
async fn an_exit_during_a_renewal_is_not_held_up_by_it() {
    // The renewal sent at 5 000 would be answered at 5 500; the command exits at 5 200.
    let job = FakeJob::new(Proc::new("job").exits_at(5_200, 3));
    let fake = Fake::new(vec![]).renewing(vec![ours(500)]);
    let cfg = config(Patience::Forever);
    let exit = hold_job(&fake, &cfg, &job).await;
    assert_eq!(exit, Ok(Exit::Child(3)));
    assert_eq!(fake.renewals(), [5_000]);
    assert_eq!(fake.released(), [5_200], "at the exit, not at the answer");
    assert!(job.sent().is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_not_ours_answer_after_the_exit_leaves_the_commands_status() {
    // The stop had not begun when the command exited: its status stands, and the answer
    // that the lock is gone (at 5 500) is never waited for.
    let job = FakeJob::new(Proc::new("job").exits_at(5_200, 3));
    let fake = Fake::new(vec![]).renewing(vec![not_ours(500)]);
    let cfg = config(Patience::Forever);
    let exit = hold_job(&fake, &cfg, &job).await;
    assert_eq!(exit, Ok(Exit::Child(3)));
    assert_eq!(fake.released(), [5_200]);
    assert!(job.sent().is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_not_ours_answer_at_the_instant_of_the_exit_is_heard_first() {
    // The lease goes before the signals and the command's exit (a storm of SIGCHLD must not
    // hold up a lease deadline): the loss is seen, its kill signal sent, and the run is 76.
    let job = FakeJob::new(Proc::new("job").exits_at(5_200, 3));
    let fake = Fake::new(vec![]).renewing(vec![not_ours(200)]);
    let cfg = config(Patience::Forever);
    let message = lost(hold_job(&fake, &cfg, &job).await);
    assert!(message.contains("(it exited with status 3)"), "{message}");
    assert_eq!(job.sent(), [(5_200, Sent::Terminate(SIGTERM))]);
    assert_eq!(fake.released(), [5_200]);
}

// The watcher's replacement.

#[tokio::test(start_paused = true)]
async fn a_watcher_that_dies_while_the_command_runs_is_replaced_and_told_the_jobs_session() {
    let job = FakeJob::new(Proc::new("job").exits_at(7_000, 0)).watchers_die_at(&[3_000]);
    let fake = Fake::new(vec![]);
    let cfg = config(Patience::Forever);
    let exit = hold_job(&fake, &cfg, &job).await;
    assert_eq!(exit, Ok(Exit::Child(0)), "the run goes on");
    let next = WATCHER + 1;
    assert_eq!(
        job.watched(),
        [
            (3_000, Watched::Dismissed(WATCHER)),
            (
                3_000,
                Watched::Started {
                    pid: next,
                    session: MAIN
                }
            ),
            // Once nothing is left, and again by the finish before the release; let go after.
            (7_000, Watched::Disarmed(next)),
            (7_000, Watched::Disarmed(next)),
            (7_000, Watched::Dismissed(next)),
        ]
    );
    assert_eq!(fake.renewals(), [5_000]);
    assert_eq!(fake.released(), [7_000]);
}

#[tokio::test(start_paused = true)]
async fn watchers_that_die_during_the_sweep_are_replaced_until_nothing_is_left() {
    // The third watcher would die at 12 s, after the run: no watcher is started then.
    let job = FakeJob::new(Proc::new("job").exits_at(1_000, 0))
        .leaving(Proc::new("backupd").only_sigkill())
        .watchers_die_at(&[4_000, 8_000, 12_000]);
    let fake = Fake::new(vec![]);
    let cfg = config(Patience::Forever);
    let exit = hold_job(&fake, &cfg, &job).await;
    assert_eq!(exit, Ok(Exit::Child(0)));
    let (second, third) = (WATCHER + 1, WATCHER + 2);
    assert_eq!(
        job.watched(),
        [
            (4_000, Watched::Dismissed(WATCHER)),
            (
                4_000,
                Watched::Started {
                    pid: second,
                    session: MAIN
                }
            ),
            (8_000, Watched::Dismissed(second)),
            (
                8_000,
                Watched::Started {
                    pid: third,
                    session: MAIN
                }
            ),
            (11_100, Watched::Disarmed(third)),
            (11_100, Watched::Disarmed(third)),
            (11_100, Watched::Dismissed(third)),
        ]
    );
    assert_eq!(
        job.sent(),
        [
            (1_100, Sent::Terminate(SIGTERM)),
            (11_100, Sent::Signal(SIGKILL)),
        ]
    );
    assert_eq!(
        fake.renewals(),
        [5_000, 10_000],
        "the lease is kept meanwhile"
    );
    assert_eq!(fake.released(), [11_100]);
}
