//! A fake job for paused-time tests of the supervisor, standing in for real processes as
//! watchexec's `TestChild` does: a main process and what it leaves behind, each ending as
//! scripted (by itself at a reading, some time after a signal, only on SIGKILL), with every
//! signal they are sent recorded at its clock reading; signals to `locked-run` at scripted
//! readings; and watchers whose deaths are scripted, with what became of each recorded.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::io;
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::time::Duration;

use nix::sys::signal::Signal;
use nix::unistd::Pid;

use crate::plumbing::clock::Clock;
use crate::plumbing::signals::{Event, Incoming};

use super::fake::TestClock;
use super::job::Job;
use super::supervised::{Events, Kill, Reap, Watching};

/// The main process's pid, which is also the job's session.
pub const MAIN: i32 = 100;
/// The first watcher's pid; each one started in place of another gets the next.
pub const WATCHER: i32 = 900;

/// How a process takes a signal other than SIGKILL and SIGCONT.
#[derive(Clone, Copy, Debug)]
enum OnSignal {
    /// Dies of it at once (the default disposition).
    Dies,
    /// Exits with this code this long after the first one (a handler that cleans up first).
    ExitsAfter(Duration, i32),
    /// Ignores it: only SIGKILL ends the process.
    Ignores,
}

/// One process of the fake job, as scripted, and when it ends.
#[derive(Clone, Debug)]
pub struct Proc {
    name: &'static str,
    on_signal: OnSignal,
    /// When it ends and with what status: by itself, or as a signal decided.
    ends: Option<(Duration, ExitStatus)>,
    /// Its end was told (a SIGCHLD).
    told: bool,
}

impl Proc {
    /// A process that runs until a signal ends it, and dies of any but SIGCONT.
    pub fn new(name: &'static str) -> Proc {
        Proc {
            name,
            on_signal: OnSignal::Dies,
            ends: None,
            told: false,
        }
    }

    /// It exits by itself at `ms` with `code`, unless a signal ended it before.
    pub fn exits_at(mut self, ms: u64, code: i32) -> Proc {
        self.ends = Some((Duration::from_millis(ms), exited(code)));
        self
    }

    /// It exits with `code` `ms` after the first signal other than SIGKILL and SIGCONT.
    pub fn exits_after_signal(mut self, ms: u64, code: i32) -> Proc {
        self.on_signal = OnSignal::ExitsAfter(Duration::from_millis(ms), code);
        self
    }

    /// It ignores every signal but SIGKILL.
    pub fn only_sigkill(mut self) -> Proc {
        self.on_signal = OnSignal::Ignores;
        self
    }

    fn alive(&self, now: Duration) -> bool {
        self.ends.is_none_or(|(at, _)| at > now)
    }

    /// `signal` reaches this live process at `now`: the earliest end it decides stands.
    fn take(&mut self, signal: Signal, now: Duration) {
        let end = match (signal, self.on_signal) {
            (Signal::SIGCONT, _) => return,
            (Signal::SIGKILL, _) => (now, killed(Signal::SIGKILL)),
            (_, OnSignal::Ignores) => return,
            (_, OnSignal::Dies) => (now, killed(signal)),
            (_, OnSignal::ExitsAfter(after, code)) => (now + after, exited(code)),
        };
        if self.ends.is_none_or(|(at, _)| end.0 < at) {
            self.ends = Some(end);
        }
    }
}

/// The wait status of a process that exited with `code`.
pub fn exited(code: i32) -> ExitStatus {
    ExitStatus::from_raw(code << 8)
}

/// The wait status of a process ended by `signal`.
pub fn killed(signal: Signal) -> ExitStatus {
    ExitStatus::from_raw(signal as i32)
}

/// A signal the fake job was sent, and how.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sent {
    /// To every process of the job ([`Kill::signal`]).
    Signal(Signal),
    /// A signal to `locked-run`, passed on to the job's group ([`Kill::forward`]).
    Forward(Signal),
    /// The kill signal, then SIGCONT ([`Kill::terminate`]).
    Terminate(Signal),
}

/// What became of the watchers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Watched {
    /// One was started in place of one that died, told the job's session.
    Started {
        pid: i32,
        session: i32,
    },
    Disarmed(i32),
    Dismissed(i32),
}

/// The job's processes, the signals `locked-run` is sent, the watchers' deaths, and the record
/// of what the supervisor did to them. Its readings are ms since its creation, as the other
/// fakes' are: make them all at the start of a paused-time test.
pub struct FakeJob {
    clock: TestClock,
    /// The main process first (pid [`MAIN`]), then what it leaves behind (pids after it).
    processes: RefCell<Vec<Proc>>,
    /// Signals to `locked-run`, at their readings.
    incoming: RefCell<VecDeque<(Duration, Signal)>>,
    /// When each watcher dies, in the order they are started.
    watcher_deaths: Vec<Duration>,
    next_watcher: Cell<i32>,
    sent: RefCell<Vec<(u64, Sent)>>,
    watched: RefCell<Vec<(u64, Watched)>>,
    /// Wakes the events' wait when a signal changed when a process ends.
    changed: tokio::sync::Notify,
}

impl FakeJob {
    /// A job whose main process is `main`.
    pub fn new(main: Proc) -> FakeJob {
        FakeJob {
            clock: TestClock::new(),
            processes: RefCell::new(vec![main]),
            incoming: RefCell::new(VecDeque::new()),
            watcher_deaths: Vec::new(),
            next_watcher: Cell::new(WATCHER + 1),
            sent: RefCell::new(Vec::new()),
            watched: RefCell::new(Vec::new()),
            changed: tokio::sync::Notify::new(),
        }
    }

    /// A process of the job's session besides the main one (a background job it started),
    /// alive from the start.
    pub fn leaving(self, process: Proc) -> FakeJob {
        self.processes.borrow_mut().push(process);
        self
    }

    /// `locked-run` is sent `signal` at `ms` (by a process, not by a terminal).
    pub fn signalled_at(self, ms: u64, signal: Signal) -> FakeJob {
        let at = Duration::from_millis(ms);
        self.incoming.borrow_mut().push_back((at, signal));
        self
    }

    /// The first watcher dies at `ms[0]`, the one started in its place at `ms[1]`, and so on.
    pub fn watchers_die_at(mut self, ms: &[u64]) -> FakeJob {
        self.watcher_deaths = ms.iter().map(|&ms| Duration::from_millis(ms)).collect();
        self
    }

    /// The job as the supervisor has it, not in a terminal, with its first watcher.
    pub fn job(&self) -> Job<FakeChild<'_>, FakeTarget<'_>, FakeWatcher<'_>> {
        let child = FakeChild {
            job: self,
            status: None,
        };
        let watcher = FakeWatcher {
            job: self,
            pid: WATCHER,
        };
        Job::new(child, FakeTarget(self), false, Some(watcher))
    }

    /// What wakes the supervisor: the signals to `locked-run`, and SIGCHLD at each end.
    pub fn events(&self) -> FakeEvents<'_> {
        FakeEvents(self)
    }

    /// Every signal the job was sent, at its reading in ms.
    pub fn sent(&self) -> Vec<(u64, Sent)> {
        self.sent.borrow().clone()
    }

    /// What became of the watchers, at its reading in ms.
    pub fn watched(&self) -> Vec<(u64, Watched)> {
        self.watched.borrow().clone()
    }

    /// `signal` reaches every live process (all of them stay in the job's first group, which
    /// a forwarded signal reaches too).
    fn hit(&self, signal: Signal) {
        let now = self.clock.now();
        for process in self.processes.borrow_mut().iter_mut() {
            if process.alive(now) {
                process.take(signal, now);
            }
        }
        self.changed.notify_waiters();
    }

    fn record(&self, sent: Sent) {
        self.sent.borrow_mut().push((self.clock.now_ms(), sent));
    }

    fn see(&self, watched: Watched) {
        self.watched
            .borrow_mut()
            .push((self.clock.now_ms(), watched));
    }

    /// What is due at `now`: the ends not told yet (one SIGCHLD for all), then the next signal.
    fn due(&self, now: Duration) -> Option<Event> {
        let mut ended = false;
        for process in self.processes.borrow_mut().iter_mut() {
            if !process.told && !process.alive(now) {
                process.told = true;
                ended = true;
            }
        }
        if ended {
            return Some(Event::ChildChanged);
        }
        let mut incoming = self.incoming.borrow_mut();
        if incoming.front().is_some_and(|&(at, _)| at <= now) {
            let (_, signal) = incoming.pop_front().expect("a signal is due");
            let from_kernel = false;
            return Some(Event::Signal(Incoming {
                signal,
                from_kernel,
            }));
        }
        None
    }

    /// When something is next due, if ever.
    fn next_due(&self) -> Option<Duration> {
        let processes = self.processes.borrow();
        let ends = processes
            .iter()
            .filter(|p| !p.told)
            .filter_map(|p| p.ends.map(|(at, _)| at));
        let signals = self.incoming.borrow().front().map(|&(at, _)| at);
        ends.chain(signals).min()
    }
}

/// The main process, as the supervisor reaps it.
pub struct FakeChild<'a> {
    job: &'a FakeJob,
    status: Option<ExitStatus>,
}

impl Reap for FakeChild<'_> {
    fn reap(&mut self) -> io::Result<bool> {
        let now = self.job.clock.now();
        let processes = self.job.processes.borrow();
        if let Some((at, status)) = processes[0].ends {
            if at <= now {
                self.status = Some(status);
            }
        }
        Ok(processes.iter().any(|p| p.alive(now)))
    }

    fn status(&self) -> Option<ExitStatus> {
        self.status
    }
}

/// Where the supervisor's signals go: recorded, then taken by each live process.
#[derive(Clone, Copy)]
pub struct FakeTarget<'a>(&'a FakeJob);

impl Kill for FakeTarget<'_> {
    fn signal(&self, signal: Signal) {
        self.0.record(Sent::Signal(signal));
        self.0.hit(signal);
    }

    fn forward(&self, signal: Signal) {
        self.0.record(Sent::Forward(signal));
        self.0.hit(signal);
    }

    fn terminate(&self, signal: Signal) {
        self.0.record(Sent::Terminate(signal));
        self.0.hit(signal);
        self.0.hit(Signal::SIGCONT);
    }

    /// Every process of the fake is a member of the job's group, so a live one is left
    /// whatever the reap said.
    fn anything_left(&self, _children_remain: bool) -> bool {
        let now = self.0.clock.now();
        self.0.processes.borrow().iter().any(|p| p.alive(now))
    }

    fn leftovers(&self) -> String {
        let now = self.0.clock.now();
        let processes = self.0.processes.borrow();
        let named: Vec<String> = (MAIN..)
            .zip(processes.iter())
            .filter(|(_, p)| p.alive(now))
            .map(|(pid, p)| format!("{pid} ({})", p.name))
            .collect();
        named.join(", ")
    }

    fn own_session(&self) -> Option<Pid> {
        Some(Pid::from_raw(MAIN))
    }
}

/// Signals to `locked-run` and SIGCHLD, each at its reading.
pub struct FakeEvents<'a>(&'a FakeJob);

impl Events for FakeEvents<'_> {
    async fn next_event(&mut self) -> Event {
        let job = self.0;
        loop {
            // Made before the look, so that a signal sent meanwhile is not missed.
            let changed = job.changed.notified();
            let now = job.clock.now();
            if let Some(event) = job.due(now) {
                return event;
            }
            let next = job.next_due();
            tokio::select! {
                () = async {
                    match next {
                        Some(at) => job.clock.sleep_until(at).await,
                        None => std::future::pending().await,
                    }
                } => {}
                () = changed => {}
            }
        }
    }
}

/// A watcher that dies when scripted, and is replaced by another of the next pid.
pub struct FakeWatcher<'a> {
    job: &'a FakeJob,
    pid: i32,
}

impl<'a> Watching for FakeWatcher<'a> {
    type Exit = (&'a FakeJob, Option<Duration>);

    fn exit(&self) -> Self::Exit {
        let death = self.job.watcher_deaths.get((self.pid - WATCHER) as usize);
        (self.job, death.copied())
    }

    async fn exited((job, death): Self::Exit) {
        match death {
            Some(at) => job.clock.sleep_until(at).await,
            None => std::future::pending().await,
        }
    }

    fn pid(&self) -> libc::pid_t {
        self.pid
    }

    fn replace(self, session: libc::pid_t) -> io::Result<FakeWatcher<'a>> {
        self.job.see(Watched::Dismissed(self.pid));
        let pid = self.job.next_watcher.get();
        self.job.next_watcher.set(pid + 1);
        self.job.see(Watched::Started { pid, session });
        Ok(FakeWatcher { job: self.job, pid })
    }

    fn disarm(&self) {
        self.job.see(Watched::Disarmed(self.pid));
    }

    fn dismiss(self) {
        self.job.see(Watched::Dismissed(self.pid));
    }
}
