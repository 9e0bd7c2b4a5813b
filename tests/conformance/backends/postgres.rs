//! `postgres://` as the conformance suite runs it: one server.

use super::{Backend, HostileStore, Servers, Store, Supports, TOO_LARGE, one_hostile, url_args};
use crate::support::hostile;
use crate::support::postgres::Postgres;

/// One PostgreSQL server.
pub struct OnePostgres;

impl Servers for Postgres {
    fn add_history_record(&self, record: &str) {
        let record = record.replace('\'', "''");
        self.psql(&format!(
            "INSERT INTO locked_run.history (name, token, ended_at, run) \
             VALUES ('job', md5('{record}'), clock_timestamp(), '{record}')"
        ));
    }

    /// Dated the last instant RFC 3339 can write: the newest, were rows ordered by date.
    fn add_history_record_ahead(&self, record: &str) {
        let record = record.replace('\'', "''");
        self.psql(&format!(
            "INSERT INTO locked_run.history (name, token, ended_at, run) \
             VALUES ('job', md5('{record}'), '9999-12-31 23:59:59.999+00', '{record}')"
        ));
    }

    fn plant_far_since(&self) {
        let changed = self.psql(&format!(
            "UPDATE locked_run.holder SET since = to_timestamp({} / 1000.0) WHERE name = 'job' \
             RETURNING name",
            // PostgreSQL's timestamps end at year 294276: the farthest it takes.
            super::FAR_SINCE_MS.min(9_000_000_000_000_000)
        ));
        assert_eq!(changed, "job", "one holder");
    }
}

impl Backend for OnePostgres {
    fn supports(&self) -> Supports {
        Supports::EVERYTHING
    }

    fn start(&self) -> Store {
        let pg = Postgres::start();
        Store::at(pg.url(), pg)
    }

    fn unreachable(&self) -> Vec<String> {
        url_args("postgres://locker@127.0.0.1:1/db?sslmode=disable".into())
    }

    /// A server whose first message announces 4 GiB.
    fn hostile(&self) -> Option<HostileStore> {
        one_hostile(
            hostile::four_gib_postgres_message,
            |port| format!("postgres://locker@127.0.0.1:{port}/db?sslmode=disable"),
            TOO_LARGE,
        )
    }
}
