//! One round over Redlock's servers: their answers gathered as they come, until the outcome
//! is known, and a renewal round's answers counted.

use std::time::Duration;

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;

use super::Here;
use crate::backend::BackendError;

/// A renewal round's answers so far, counted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Tally {
    /// Ours, extended.
    pub(super) ours: usize,
    /// Held by another, or absent: the lock is not ours there now.
    pub(super) not_ours: usize,
    /// No usable answer.
    pub(super) failed: usize,
}

impl Tally {
    pub(super) fn of(answers: &[Option<Result<Here, BackendError>>]) -> Tally {
        let mut tally = Tally::default();
        for answer in answers.iter().flatten() {
            match answer {
                Ok(Here::Ours) => tally.ours += 1,
                Ok(Here::Absent | Here::Other) => tally.not_ours += 1,
                Err(_) => tally.failed += 1,
            }
        }
        tally
    }

    /// Servers that will not count toward the quorum this round.
    pub(super) fn against(&self) -> usize {
        self.not_ours + self.failed
    }
}

/// What the answers so far say about a round.
pub(super) enum Outcome {
    Pending,
    /// Known: stop now.
    Known,
    /// Known, but the others may have this long to finish.
    KnownAfter(Duration),
}

/// Runs `futures` concurrently and collects their outputs by position until `done` says the
/// outcome is known (or all have ended); the rest are dropped (their connections with them).
pub(super) async fn gather<T, F: Future<Output = T>>(
    futures: impl Iterator<Item = F>,
    done: impl Fn(&[Option<T>]) -> Outcome,
) -> Vec<Option<T>> {
    let mut pending: FuturesUnordered<_> = futures
        .enumerate()
        .map(|(i, f)| async move { (i, f.await) })
        .collect();
    let mut outputs: Vec<Option<T>> = (0..pending.len()).map(|_| None).collect();
    let mut until: Option<tokio::time::Instant> = None;
    loop {
        let next = match until {
            None => pending.next().await,
            Some(until) => tokio::time::timeout_at(until, pending.next())
                .await
                .unwrap_or_default(),
        };
        let Some((i, output)) = next else { break };
        outputs[i] = Some(output);
        match done(&outputs) {
            Outcome::Pending => {}
            Outcome::Known => break,
            Outcome::KnownAfter(grace) => {
                until.get_or_insert_with(|| tokio::time::Instant::now() + grace);
            }
        }
    }
    outputs
}
