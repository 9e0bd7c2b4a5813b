//! What N servers' reports of a lock mean together: `status` across Redlock's servers, and
//! the holder a waiter names.

use std::time::Duration;

use crate::backend::{Busy, Expiry, Holder, Report, Slot};

/// The lock as a quorum of `answered` sees it: held when a quorum holds one owner's value,
/// until the quorum-th longest of their leases ends; the last fence any of them issued; the
/// most waiters any of them counts.
pub(super) fn summarize(answered: &[&Report], quorum: usize) -> Report {
    let owner = answered
        .iter()
        .filter_map(|r| r.value.as_deref())
        .find(|v| {
            answered
                .iter()
                .filter(|r| r.value.as_deref() == Some(*v))
                .count()
                >= quorum
        });
    let holding: Vec<&&Report> = answered
        .iter()
        .filter(|r| owner.is_some() && r.value.as_deref() == owner)
        .collect();
    let mut expiries: Vec<Expiry> = holding
        .iter()
        .filter_map(|r| r.held.as_ref().map(|b| b.expiry))
        .collect();
    expiries.sort_by_key(|e| std::cmp::Reverse(e.left()));
    let held = owner.map(|_| Busy {
        holder: holding
            .iter()
            .filter_map(|r| r.held.as_ref().map(|b| b.holder.clone()))
            .find(Holder::is_known)
            .unwrap_or_default(),
        expiry: expiries
            .get(quorum - 1)
            .copied()
            .unwrap_or(Expiry::In(Duration::ZERO)),
    });
    Report {
        fence: answered.iter().filter_map(|r| r.fence).max(),
        holders: held
            .iter()
            .map(|busy| Slot {
                token: owner.map(str::to_owned),
                busy: busy.clone(),
            })
            .collect(),
        limit: held.as_ref().map(|_| 1),
        held,
        value: owner.map(str::to_owned),
        waiters: answered.iter().filter_map(|r| r.waiters).max(),
        ..Report::default()
    }
}

/// Whether two servers report the same holder: one process on one host (its `since` and fence
/// may differ between servers by a moment). Holders that are not `locked-run`s carry no
/// metadata and cannot be told apart: they count as one.
pub(super) fn same_owner(a: &Holder, b: &Holder) -> bool {
    a.host == b.host && a.pid == b.pid
}

/// The holder most servers report (a quorum's holder, when there is one).
pub(super) fn most_common_holder(busy: &[Busy]) -> Holder {
    let mut best: Option<(&Holder, usize)> = None;
    for b in busy {
        let count = busy
            .iter()
            .filter(|o| same_owner(&o.holder, &b.holder))
            .count();
        if best.is_none_or(|(_, c)| count > c) {
            best = Some((&b.holder, count));
        }
    }
    best.map(|(h, _)| h.clone()).unwrap_or_default()
}
