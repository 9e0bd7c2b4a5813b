//! Critical sections logged by children (start and end, on CLOCK_MONOTONIC, with their
//! fence), and the checks that none overlapped beyond the limit and no fence repeated.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// A child that appends `start FENCE T` and `end FENCE T` (T: CLOCK_MONOTONIC, ns) to the shared
/// log, holding the lock 5-25 ms; on SIGTERM it logs its end and exits.
pub const CRITICAL_SECTION: &str = r#"
use Time::HiRes qw(clock_gettime CLOCK_MONOTONIC sleep);
my ($log) = @ARGV; my $f = $ENV{LOCKED_RUN_FENCE};
sub note { open(my $h, ">>", $log) or die; printf $h "%s %d %d %d\n", $_[0], $f, int(clock_gettime(CLOCK_MONOTONIC) * 1e9), $$; close $h; }
$SIG{TERM} = sub { note("end"); exit 143 };
note("start"); sleep(0.005 + rand(0.02)); note("end");
"#;

pub struct Section {
    fence: u64,
    start: u64,
    end: Option<u64>,
}

/// At no instant do more than `limit` critical sections of `log` run at once, and no fence is
/// issued twice; returns the number of sections and the most that ran at once. (Of several
/// holders, two that acquire one after the other may start their commands in either order, so
/// start order says nothing of fence order.)
pub fn check_concurrency(log: &Path, limit: usize) -> (usize, usize) {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let mut events: Vec<(u64, i32)> = Vec::new();
    let mut fences = BTreeSet::new();
    let mut starts = 0;
    for line in text.lines() {
        let f: Vec<&str> = line.split(' ').collect();
        let t: u64 = f[2].parse().unwrap();
        if f[0] == "start" {
            starts += 1;
            assert!(
                fences.insert(f[1].to_owned()),
                "fence {} issued twice",
                f[1]
            );
            events.push((t, 1));
        } else {
            events.push((t, -1));
        }
    }
    // At equal instants an end counts before a start.
    events.sort();
    let (mut now, mut most) = (0i32, 0i32);
    for (_, delta) in events {
        now += delta;
        most = most.max(now);
    }
    assert!(
        most as usize <= limit,
        "{most} sections ran at once; the limit is {limit}"
    );
    (starts, most as usize)
}

/// No two critical sections overlap, and fences grow strictly in start order.
pub fn check_log(log: &Path) -> usize {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let mut by_pid: BTreeMap<u64, Section> = BTreeMap::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split(' ').collect();
        let (kind, fence, t, pid): (&str, u64, u64, u64) = (
            f[0],
            f[1].parse().unwrap(),
            f[2].parse().unwrap(),
            f[3].parse().unwrap(),
        );
        match kind {
            "start" => {
                by_pid.insert(
                    pid,
                    Section {
                        fence,
                        start: t,
                        end: None,
                    },
                );
            }
            _ => by_pid.get_mut(&pid).expect("end after start").end = Some(t),
        }
    }
    let mut sections: Vec<Section> = by_pid.into_values().collect();
    sections.sort_by_key(|s| s.start);
    for pair in sections.windows(2) {
        let (a, b) = (&pair[0], &pair[1]);
        let end = a
            .end
            .unwrap_or_else(|| panic!("fence {}: a section that never ended", a.fence));
        assert!(
            end < b.start,
            "fences {} and {} overlap by {} us",
            a.fence,
            b.fence,
            (end - b.start) / 1000
        );
        assert!(
            b.fence > a.fence,
            "fence {} started after fence {}",
            b.fence,
            a.fence
        );
    }
    sections.len()
}
