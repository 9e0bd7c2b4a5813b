//! One pass on one backend: start the clients and the nemesis, wait for them, let the leases
//! lapse, look for what is left (keys, locks, processes), check the history, and print the
//! runs by outcome, the faults by kind and the violations, each named.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::backend::Backend;
use crate::client::{Pass, Wrapper, client};
use crate::history::{History, Violation, create_db};
use crate::hostile;
use crate::monitor::{self, monitor};
use crate::neighbour::{self, Neighbour};
use crate::nemesis::nemesis;
use crate::plan::{DAEMON_MAX_MS, TTL_MS, names};
use crate::support::{alive, signal};
use crate::{liveness, model_check, safety};

pub struct Config {
    pub seed: u64,
    pub secs: Duration,
    pub clients: u64,
    pub bin: String,
    pub nested: bool,
}

/// At most this many violations of one invariant are printed (all are counted).
const PRINTED: usize = 12;

fn outcome(w: &Wrapper) -> String {
    if w.hung {
        return "hung (killed)".into();
    }
    match w.status {
        0 => "ran, 0".into(),
        75 => "not acquired, 75".into(),
        69 => "unreachable, 69".into(),
        76 => "lease lost, 76".into(),
        124 => "--max-run, 124".into(),
        143 | -15 => "SIGTERMed, 143".into(),
        -9 => "SIGKILLed".into(),
        other => format!("other, {other}"),
    }
}

/// Runs one pass; true when no violation (excused ones aside) was found.
pub fn pass(backend: &dyn Backend, config: &Config) -> bool {
    let started = Instant::now();
    let label = backend.label();
    println!();
    println!(
        "== {label}: seed {}, {:?}, {} clients ==",
        config.seed, config.secs, config.clients
    );
    let scratch = tempfile::tempdir().unwrap();
    let history = scratch.path().join("history").display().to_string();
    let db = scratch.path().join("fenced.db").display().to_string();
    std::fs::write(&history, "").unwrap();
    let names = names(backend.holders_ok());
    create_db(&db, &names);
    let neighbour = Neighbour::start(&names);
    let pass = Pass {
        bin: config.bin.clone(),
        history: history.clone(),
        db: db.clone(),
        url_args: [backend.url_args(), backend.run_args()].concat(),
        scratch: scratch.path().to_owned(),
        deadline: Instant::now() + config.secs,
        names: names.clone(),
        nested_mix: config.nested,
        strace: std::process::Command::new("strace")
            .arg("-V")
            .stdout(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success()),
        metrics: neighbour.metrics_dir().to_owned(),
    };
    let urls = backend.url_args();
    let (wrappers, faults, seen, (printed, snapshots)) = std::thread::scope(|s| {
        let nemesis = s.spawn(|| nemesis(backend, config.seed, pass.deadline, &neighbour, &names));
        let monitor = s.spawn(|| monitor(&config.bin, &urls, &names, pass.deadline));
        let reader = s.spawn(|| hostile::reader(&config.bin, &urls, &names, pass.deadline));
        let clients: Vec<_> = (0..config.clients)
            .map(|i| {
                let pass = &pass;
                s.spawn(move || client(pass, config.seed, i))
            })
            .collect();
        let wrappers: Vec<Wrapper> = clients
            .into_iter()
            .flat_map(|c| c.join().expect("a client thread"))
            .collect();
        (
            wrappers,
            nemesis.join().expect("the nemesis thread"),
            monitor.join().expect("the monitor thread"),
            reader.join().expect("the reader thread"),
        )
    });
    let ran_for = started.elapsed();
    // The last daemons a job left (see `shapes.rs`) end by themselves within this.
    let daemons_done = Instant::now() + Duration::from_millis(DAEMON_MAX_MS + 1000);
    backend.heal();

    // Once everything stopped: leases lapse within 2*T, a dead waiter's place within about 2 s.
    let quiet = Instant::now() + Duration::from_millis(2 * TTL_MS + 4000);
    let mut left = backend.leftovers();
    while !left.is_empty() && Instant::now() < quiet {
        std::thread::sleep(Duration::from_millis(250));
        left = backend.leftovers();
    }
    std::thread::sleep(daemons_done.saturating_duration_since(Instant::now()));
    let mut h = History::read(
        &history,
        &db,
        wrappers,
        faults,
        names.clone(),
        backend.fair_order(),
    );
    h.clock_steps = monitor::clock_steps(&seen);
    let mut violations: Vec<Violation> = left
        .into_iter()
        .map(|l| Violation {
            invariant: "left held or queued after everything stopped",
            name: "-".into(),
            detail: l,
            excused: None,
        })
        .collect();
    violations.extend(h.malformed.iter().map(|m| Violation {
        invariant: "malformed history record",
        name: "-".into(),
        detail: m.clone(),
        excused: None,
    }));
    leftover_processes(&h, &history, &mut violations);
    violations.extend(printed);
    let (said, last) = hostile::settled(&config.bin, &urls, &names);
    violations.extend(said);
    let snapshots: Vec<_> = snapshots.into_iter().chain(last).collect();
    hostile::check_history(&h, &snapshots, &mut violations);
    hostile::check_stderr(&h, &mut violations);
    neighbour::check_ends(&h, &mut violations);
    neighbour::check_counts(
        &h,
        neighbour.metrics_dir(),
        &h.faults,
        config.nested,
        &mut violations,
    );
    safety::check(&h, &mut violations);
    monitor::check(&h, &seen, &mut violations);
    model_check::check(&h, &seen, label != "file", &mut violations);
    liveness::check(&h, &mut violations);
    print(&h, &violations, ran_for, started.elapsed());
    if std::env::var("LOCKED_RUN_FAULTS_KEEP").is_ok() {
        println!("history kept in {}", scratch.keep().display());
    }
    let failed = violations.iter().filter(|v| v.excused.is_none()).count();
    println!("{label}: {}", if failed == 0 { "pass" } else { "fail" });
    failed == 0
}

/// A command (or its observer's parent) still running now that every wrapper ended and the
/// leases lapsed is a violation; it is killed (it is a descendant of ours, named by pid).
/// A pid is taken for the same process only when its command line names this pass's history
/// file and the run: pids wrap (at 32768 here), and another pass running at the same time
/// starts processes of the same program that may be given a pid this pass recorded.
fn leftover_processes(h: &History, history: &str, out: &mut Vec<Violation>) {
    for s in h.sections.values() {
        let job = [(s.pid, "the command")]
            .into_iter()
            .chain(s.grand.values().map(|g| (g.pid, g.mode.as_str())));
        for (pid, what) in job {
            let cmdline = command_line(pid);
            let args: Vec<&[u8]> = cmdline.split(|&b| b == 0).collect();
            let has = |arg: &str| args.contains(&arg.as_bytes());
            let ours = has(history) && has(&s.run.to_string());
            if ours && alive(pid) {
                signal(pid, libc::SIGKILL);
                out.push(Violation {
                    invariant: "command left running after everything stopped",
                    name: s.name.clone(),
                    detail: format!("run {} {what} pid {pid} (fence {})", s.run, s.fence),
                    excused: None,
                });
            }
        }
    }
}

/// A process's arguments; for one whose main thread ended (its own entry reads empty), those
/// its live threads read.
fn command_line(pid: i32) -> Vec<u8> {
    let own = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    if !own.is_empty() {
        return own;
    }
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return own;
    };
    tasks
        .flatten()
        .map(|t| std::fs::read(t.path().join("cmdline")).unwrap_or_default())
        .find(|c| !c.is_empty())
        .unwrap_or_default()
}

fn print(h: &History, violations: &[Violation], ran_for: Duration, wall: Duration) {
    let mut outcomes: BTreeMap<String, usize> = BTreeMap::new();
    for w in h.wrappers.values() {
        *outcomes.entry(outcome(w)).or_default() += 1;
    }
    let nested = h.sections.keys().filter(|&&r| History::is_inner(r)).count();
    println!(
        "runs: {} wrappers, {} commands started ({} nested), {} fenced writes ({} rejected)",
        h.wrappers.len(),
        h.sections.len(),
        nested,
        h.writes.len(),
        h.writes.iter().filter(|w| w.changed != 1).count()
    );
    for (what, n) in &outcomes {
        println!("  {n:5}  {what}");
    }
    if let Some(w) = h.wrappers.values().max_by_key(|w| w.max_rss_kb) {
        println!(
            "peak memory of a wrapper: {:.1} MiB (run {}, status {})",
            w.max_rss_kb as f64 / 1024.0,
            w.plan.run,
            w.status
        );
    }
    let mut shapes: BTreeMap<&str, usize> = BTreeMap::new();
    for g in h.sections.values().flat_map(|s| s.grand.values()) {
        *shapes.entry(g.mode.as_str()).or_default() += 1;
    }
    if !shapes.is_empty() {
        let list: Vec<String> = shapes.iter().map(|(m, n)| format!("{n} {m}")).collect();
        println!(
            "processes the commands started out of their group: {} (plain: under timeout or \
             set -m; setpgid; daemon: setsid)",
            list.join(", ")
        );
    }
    let mut process_faults: BTreeMap<&str, usize> = BTreeMap::new();
    for w in h.wrappers.values() {
        if let Some((sig, _)) = w.sent {
            let kind = match sig {
                libc::SIGKILL => "wrapper SIGKILLed",
                libc::SIGTERM => "wrapper SIGTERMed",
                _ => "wrapper SIGSTOPped",
            };
            *process_faults.entry(kind).or_default() += 1;
        }
        if w.plan.held_ms.is_some() {
            let kind = match (h.sections.contains_key(&w.plan.run), w.status) {
                (false, 76) => "wrapper held up after its grant: started nothing (76)",
                (true, _) => "wrapper held up after its grant: started its command",
                _ => "wrapper held up after its grant: other end",
            };
            *process_faults.entry(kind).or_default() += 1;
        }
    }
    let mut faults: BTreeMap<&str, usize> = BTreeMap::new();
    for f in &h.faults {
        *faults.entry(f.fault.label()).or_default() += 1;
    }
    println!("faults injected:");
    for (what, n) in process_faults.iter().chain(faults.iter()) {
        println!("  {n:5}  {what}");
    }
    let mut by_invariant: BTreeMap<&str, (Vec<&Violation>, usize)> = BTreeMap::new();
    for v in violations {
        let entry = by_invariant.entry(v.invariant).or_default();
        if v.excused.is_some() {
            entry.1 += 1;
        } else {
            entry.0.push(v);
        }
    }
    let real: usize = by_invariant.values().map(|(v, _)| v.len()).sum();
    let excused: usize = by_invariant.values().map(|(_, e)| e).sum();
    println!("violations: {real} ({excused} excused: beyond the guarantee, around faults)");
    for (invariant, (list, excused)) in &by_invariant {
        println!("  {invariant}: {} ({excused} excused)", list.len());
        for v in list.iter().take(PRINTED) {
            println!("    VIOLATION [{invariant}] NAME {}: {}", v.name, v.detail);
        }
    }
    if std::env::var("LOCKED_RUN_FAULTS_VERBOSE").is_ok() {
        for v in violations.iter().filter(|v| v.excused.is_some()) {
            println!(
                "    excused [{}] NAME {}: {} ({})",
                v.invariant,
                v.name,
                v.detail,
                v.excused.as_deref().unwrap_or("")
            );
        }
    }
    if !h.clock_steps.is_empty() {
        let steps: Vec<String> = h
            .clock_steps
            .iter()
            .map(|(t, step)| format!("{:+.1} ms at {:.3}s", *step as f64 / 1e6, *t as f64 / 1e9))
            .collect();
        println!(
            "wall clock steps (the servers' lease clock): {}",
            steps.join(", ")
        );
    }
    println!("wall time: {:.1?} running, {:.1?} in all", ran_for, wall);
}
