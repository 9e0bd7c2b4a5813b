//! Logging on stderr: warnings only by default (cron mails any output), `-v` for what happens,
//! `-q` for errors only, `LOCKED_RUN_LOG` for a tracing filter. Every line starts `locked-run:`.

use std::fmt::{self, Write as _};
use std::io::Write as _;

use tracing::field::{Field, Visit};
use tracing::level_filters::LevelFilter;
use tracing::{Event, Level, Metadata, Subscriber, span};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

use crate::cli::LogArgs;

/// Installs the stderr logger for the process.
pub fn init(args: &LogArgs) {
    let level = match (args.quiet, args.verbose) {
        (true, _) => Level::ERROR,
        (false, 0) => Level::WARN,
        (false, 1) => Level::INFO,
        (false, 2) => Level::DEBUG,
        (false, _) => Level::TRACE,
    };
    match std::env::var("LOCKED_RUN_LOG")
        .ok()
        .filter(|f| !f.trim().is_empty())
    {
        Some(filter) => {
            let _ = tracing_subscriber::fmt()
                .with_writer(std::io::stderr)
                .event_format(Plain)
                .with_env_filter(EnvFilter::new(filter))
                .try_init();
        }
        // The usual case needs no filter parsing, span registry or formatter machinery: a few
        // lines that print events up to a level keep every run's start-up short.
        None => {
            let _ = tracing::subscriber::set_global_default(Leveled { max: level });
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
        let mut line = format!("locked-run: {}: ", level_word(event.metadata().level()));
        event.record(&mut Line(&mut line));
        line.push('\n');
        let _ = std::io::stderr().write_all(line.as_bytes());
    }

    fn enter(&self, _: &span::Id) {}

    fn exit(&self, _: &span::Id) {}
}

/// Writes an event's message, then its other fields as `key=value`.
struct Line<'a>(&'a mut String);

impl Visit for Line<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.0.push_str(value);
        } else {
            let _ = write!(self.0, " {}={value}", field.name());
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        if field.name() == "message" {
            let _ = write!(self.0, "{value:?}");
        } else {
            let _ = write!(self.0, " {}={value:?}", field.name());
        }
    }
}

/// The same line, through tracing-subscriber's formatter (with `LOCKED_RUN_LOG`).
struct Plain;

impl<S, N> FormatEvent<S, N> for Plain
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        write!(
            writer,
            "locked-run: {}: ",
            level_word(event.metadata().level())
        )?;
        ctx.field_format().format_fields(writer.by_ref(), event)?;
        writeln!(writer)
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
