//! What others observe of a run: the Prometheus textfile (`--metrics-dir`), the monitor's
//! pings (`--ping`), and systemd's status line (`sd_notify`).

pub mod metrics;
pub mod notify;
pub mod ping;
