//! Logging on stderr: warnings only by default (cron mails any output), `-v` for what happens,
//! `-q` for errors only, `LOCKED_RUN_LOG` for a tracing filter. Lines start `locked-run:`;
//! with `--log-format json` every line is one JSON object instead, for log shippers.
//!
//! The run's milestones are events with an `event` field (`acquired`, `renewed`,
//! `renewal_failed`, `lost`, `child_exited`, `released`, ...) and their figures as fields; text
//! lines show only the message, JSON lines everything.

use std::fmt::{self, Write as _};
use std::io::Write as _;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, SyncSender};

use serde_json::{Map, Value, json};
use tracing::field::{Field, Visit};
use tracing::level_filters::LevelFilter;
use tracing::{Event, Level, Metadata, Subscriber, span};
#[cfg(feature = "cli")]
use tracing_subscriber::EnvFilter;
#[cfg(feature = "cli")]
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
#[cfg(feature = "cli")]
use tracing_subscriber::util::SubscriberInitExt;

use crate::text::line_form;

static FORMAT: OnceLock<LogFormat> = OnceLock::new();
/// `-q`: a watched wait says nothing either.
static QUIET: AtomicBool = AtomicBool::new(false);
static LOCK: OnceLock<String> = OnceLock::new();
/// Log lines not written because stderr was full or the queue to it was (see `write_line`).
static DROPPED: AtomicU64 = AtomicU64::new(0);

/// How log lines are written: as text, or as one JSON object each (for log shippers).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

/// What the log is asked for: `-v` (a count), `-q`, `--log-format`.
#[derive(Clone, Copy, Debug, Default)]
pub struct Logging {
    pub verbose: u8,
    pub quiet: bool,
    pub format: LogFormat,
}

/// Installs the stderr logger for the process (the binary's: a library leaves that to its
/// program).
#[cfg(feature = "cli")]
pub fn init(args: &Logging) {
    let format = args.format;
    let _ = FORMAT.set(format);
    QUIET.store(args.quiet, Ordering::Relaxed);
    let level = match (args.quiet, args.verbose, format) {
        (true, _, _) => Level::ERROR,
        // Machines read JSON: they get every milestone, renewals included.
        (false, 0, LogFormat::Json) => Level::DEBUG,
        (false, 0, LogFormat::Text) => Level::WARN,
        (false, 1, _) => Level::INFO,
        (false, 2, _) => Level::DEBUG,
        (false, _, _) => Level::TRACE,
    };
    match std::env::var("LOCKED_RUN_LOG")
        .ok()
        .filter(|f| !f.trim().is_empty())
    {
        Some(filter) => {
            let _ = tracing_subscriber::registry()
                .with(EnvFilter::new(filter))
                .with(Lines)
                .try_init();
        }
        // The usual case needs no filter parsing or span registry: a few lines that print
        // events up to a level keep every run's start-up short.
        None => {
            let _ = tracing::subscriber::set_global_default(Leveled { max: level });
        }
    }
}

/// Names the lock in every JSON line from here on.
pub fn set_lock(name: &str) {
    let _ = LOCK.set(name.to_owned());
}

fn format() -> LogFormat {
    FORMAT.get().copied().unwrap_or(LogFormat::Text)
}

/// The one line a failure owes the user, in the log's format.
pub fn failure_line(message: &str, status: u8) -> String {
    match format() {
        LogFormat::Text => format!("locked-run: {}", line_form(message)),
        LogFormat::Json => {
            let mut fields = Map::new();
            fields.insert("event".into(), json!("failed"));
            fields.insert("status".into(), json!(status));
            json_line(Level::ERROR, message, fields)
        }
    }
}

/// Prints events up to `max` on stderr; `locked-run` uses no spans.
struct Leveled {
    max: Level,
}

impl Subscriber for Leveled {
    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        *metadata.level() <= self.max
    }

    fn max_level_hint(&self) -> Option<LevelFilter> {
        Some(LevelFilter::from_level(self.max))
    }

    fn new_span(&self, _: &span::Attributes<'_>) -> span::Id {
        span::Id::from_u64(1)
    }

    fn record(&self, _: &span::Id, _: &span::Record<'_>) {}

    fn record_follows_from(&self, _: &span::Id, _: &span::Id) {}

    fn event(&self, event: &Event<'_>) {
        print(event);
    }

    fn enter(&self, _: &span::Id) {}

    fn exit(&self, _: &span::Id) {}
}

/// The same printing, as a layer under `LOCKED_RUN_LOG`'s filter.
#[cfg(feature = "cli")]
struct Lines;

#[cfg(feature = "cli")]
impl<S: Subscriber> Layer<S> for Lines {
    fn on_event(&self, event: &Event<'_>, _: Context<'_, S>) {
        print(event);
    }
}

fn print(event: &Event<'_>) {
    let mut fields = Fields::default();
    event.record(&mut fields);
    let level = *event.metadata().level();
    write_line(render(level, &fields.message, fields.rest));
}

fn render(level: Level, message: &str, rest: Map<String, Value>) -> String {
    match format() {
        LogFormat::Text => format!("locked-run: {}: {}", level_word(&level), line_form(message)),
        LogFormat::Json => json_line(level, message, rest),
    }
}

/// Lines on their way to stderr, written by a thread of their own (see [`write_line`]).
static QUEUE: OnceLock<Option<SyncSender<Out>>> = OnceLock::new();
/// How many lines may wait for the writer before more are dropped.
const QUEUED: usize = 256;

enum Out {
    Line(String),
    /// Text as it is, no newline added (a line updated in place on a terminal).
    Raw(String),
    /// Answered once every line before it was written (or dropped).
    Flush(SyncSender<()>),
}

/// Hands one log line to the writer thread, never waiting: the lease clock runs on this
/// thread, and neither a reader of stderr that stopped reading (a full pipe) nor a write that
/// blocks (a stderr file on a stalled disk) may hold up a renewal or a kill. A line that finds
/// the queue full is dropped and counted; so is one the writer finds stderr not writable for
/// (a line, far shorter than PIPE_BUF, goes into a pipe that polls writable without
/// blocking). The count is written with the next line.
fn write_line(line: String) {
    let queue = QUEUE.get_or_init(start_writer);
    match queue {
        Some(queue) => {
            if queue.try_send(Out::Line(line)).is_err() {
                DROPPED.fetch_add(1, Ordering::Relaxed);
            }
        }
        // No thread could be started: written here, as long as stderr does not block.
        None => write_now(&line),
    }
}

fn start_writer() -> Option<SyncSender<Out>> {
    let (queue, lines) = mpsc::sync_channel::<Out>(QUEUED);
    let writer = std::thread::Builder::new()
        .name("log".into())
        .spawn(move || {
            for out in lines {
                match out {
                    Out::Line(line) => write_now(&line),
                    Out::Raw(text) => {
                        if stderr_writable(0) {
                            let _ = std::io::stderr().write_all(text.as_bytes());
                        }
                    }
                    Out::Flush(done) => {
                        let _ = done.send(());
                    }
                }
            }
        });
    writer.ok().map(|_| queue)
}

fn write_now(line: &str) {
    if !stderr_writable(0) {
        DROPPED.fetch_add(1, Ordering::Relaxed);
        return;
    }
    let mut text = dropped_note();
    text.push_str(line);
    text.push('\n');
    let _ = std::io::stderr().write_all(text.as_bytes());
}

/// Whether a wait someone watches may say how it goes: text logs, and no `-q`.
pub fn progress_allowed() -> bool {
    !QUIET.load(Ordering::Relaxed) && format() == LogFormat::Text
}

/// A watched wait's line (`line` without `locked-run: `): on a terminal (`in_place`) written
/// over the last one, else a line of its own. Through the writer thread, never waiting.
pub fn progress(line: &str, in_place: bool) {
    let text = format!("locked-run: {}", line_form(line));
    match (in_place, QUEUE.get_or_init(start_writer)) {
        (true, Some(queue)) => {
            if queue.try_send(Out::Raw(format!("\r{text}\x1b[K"))).is_err() {
                DROPPED.fetch_add(1, Ordering::Relaxed);
            }
        }
        _ => write_line(text),
    }
}

/// Ends a line updated in place, so that what follows starts on a line of its own.
pub fn progress_done() {
    if let Some(Some(queue)) = QUEUE.get() {
        let _ = queue.try_send(Out::Raw("\n".into()));
    }
}

/// Writes out the lines still queued (waiting at most a second: the lock is no longer held
/// then), and says how many lines were dropped, if any, before `locked-run` exits.
pub fn report_dropped() {
    if let Some(Some(queue)) = QUEUE.get() {
        let (done, written) = mpsc::sync_channel(1);
        if queue.try_send(Out::Flush(done)).is_ok() {
            let _ = written.recv_timeout(std::time::Duration::from_secs(1));
        }
    }
    if DROPPED.load(Ordering::Relaxed) > 0 {
        write_last(dropped_note().trim_end());
    }
}

/// Writes the last line before `locked-run` exits, as far as stderr takes it within a second:
/// a full pipe nobody reads must not keep the process from exiting with its status (signals
/// are still handled by then, so SIGTERM would not end the wait), and a pipe whose reader is
/// gone (EPIPE) must not turn that status into an abort. Written in pieces of PIPE_BUF, each
/// once stderr polls writable: a pipe that does has a page free, so no piece blocks (a
/// regular file always polls writable; one on a stalled disk can still hold the write).
pub fn write_last(line: &str) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(1);
    for piece in format!("{line}\n").as_bytes().chunks(libc::PIPE_BUF) {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if !stderr_writable(left.as_millis() as i32) || std::io::stderr().write_all(piece).is_err()
        {
            return;
        }
    }
}

fn dropped_note() -> String {
    match DROPPED.swap(0, Ordering::Relaxed) {
        0 => String::new(),
        n => {
            let note = format!("{n} log lines were dropped: stderr was not being read");
            render(Level::WARN, &note, Map::new()) + "\n"
        }
    }
}

fn stderr_writable(timeout_ms: i32) -> bool {
    let mut fd = libc::pollfd {
        fd: libc::STDERR_FILENO,
        events: libc::POLLOUT,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    let ready = unsafe { libc::poll(&mut fd, 1, timeout_ms) };
    // An error of poll itself: write as before.
    ready != 0
}

fn json_line(level: Level, message: &str, rest: Map<String, Value>) -> String {
    let mut object = Map::new();
    let now = std::time::SystemTime::now();
    object.insert(
        "ts".into(),
        json!(humantime::format_rfc3339_millis(now).to_string()),
    );
    object.insert("level".into(), json!(level_word(&level)));
    if let Some(lock) = LOCK.get() {
        object.insert("lock".into(), json!(lock));
    }
    object.insert("pid".into(), json!(std::process::id()));
    // Bounded as a text line is: a server's error of megabytes is cut, field by field.
    let bounded = |value: Value| match value {
        Value::String(text) => Value::String(crate::text::bounded(&text)),
        other => other,
    };
    object.extend(rest.into_iter().map(|(k, v)| (k, bounded(v))));
    object.insert("message".into(), json!(crate::text::bounded(message)));
    crate::text::json(&Value::Object(object))
}

/// An event's message, and its other fields as JSON values.
#[derive(Default)]
struct Fields {
    message: String,
    rest: Map<String, Value>,
}

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.message.push_str(value);
        } else {
            self.rest.insert(field.name().into(), json!(value));
        }
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.rest.insert(field.name().into(), json!(value));
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.rest.insert(field.name().into(), json!(value));
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.rest.insert(field.name().into(), json!(value));
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        if field.name() == "message" {
            let _ = write!(self.message, "{value:?}");
        } else {
            self.rest
                .insert(field.name().into(), json!(format!("{value:?}")));
        }
    }
}

fn level_word(level: &Level) -> &'static str {
    match *level {
        Level::ERROR => "error",
        Level::WARN => "warning",
        Level::INFO => "info",
        Level::DEBUG => "debug",
        Level::TRACE => "trace",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 43's review: a JSON line carried a server's error of a megabyte whole.
    #[test]
    fn a_json_line_is_cut_as_a_text_line_is() {
        let huge = "\u{1b}".repeat(1 << 20);
        let mut rest = Map::new();
        rest.insert("error".into(), json!(huge.clone()));
        rest.insert("attempt".into(), json!(3));
        let line = json_line(Level::WARN, &huge, rest);
        assert!(line.len() < 32 << 10, "{}", line.len());
        let back: Value = serde_json::from_str(&line).unwrap();
        let message = back["message"].as_str().unwrap();
        assert!(message.ends_with("... (cut)") && message.starts_with("\u{1b}"));
        assert_eq!(back["attempt"], 3);
    }
}
