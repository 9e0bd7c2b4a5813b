//! Logging on stderr: warnings only by default (cron mails any output), `-v` for what happens,
//! `-q` for errors only, `LOCKED_RUN_LOG` for a tracing filter. Every line starts `locked-run:`.

use std::fmt;

use tracing::{Event, Level, Subscriber};
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
    let builder = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .event_format(Plain);
    let filter = std::env::var("LOCKED_RUN_LOG")
        .ok()
        .filter(|f| !f.trim().is_empty());
    // Only parse a filter when one is given: a level needs no directive parsing at start-up.
    let _ = match filter {
        Some(filter) => builder.with_env_filter(EnvFilter::new(filter)).try_init(),
        None => builder.with_max_level(level).try_init(),
    };
}

/// `locked-run: warning: message key=value`.
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
        let level = match *event.metadata().level() {
            Level::ERROR => "error",
            Level::WARN => "warning",
            Level::INFO => "info",
            Level::DEBUG => "debug",
            Level::TRACE => "trace",
        };
        write!(writer, "locked-run: {level}: ")?;
        ctx.field_format().format_fields(writer.by_ref(), event)?;
        writeln!(writer)
    }
}
