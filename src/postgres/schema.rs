//! The schema and its tables: what DESIGN names (`locked_run.fence`, `locked_run.holder`) and
//! the implementation's own (the queue of waiters, buried tokens, history), made on first use,
//! only after a query found them missing, under a transaction advisory lock so that two first
//! runs at once do not trip over each other's `CREATE`; and the SQL an administrator runs when
//! the lock's role may not create them (`doctor` prints it).

/// The advisory lock two first runs serialise their `CREATE`s on (`locked_r`, as a number).
pub const CREATE_LOCK: i64 = 0x6c6f_636b_6564_5f72;

/// The tables. `holder` is live while `expires_at > clock_timestamp()`; `queue.place` orders
/// the waiters of a NAME (assigned under the NAME's fence lock, so in arrival order) and
/// `alive_until` is the keep-alive of a place, on the server's clock.
pub const TABLES: &str = "\
CREATE SCHEMA IF NOT EXISTS locked_run;
CREATE TABLE IF NOT EXISTS locked_run.fence (
  name text PRIMARY KEY,
  fence bigint NOT NULL
);
CREATE TABLE IF NOT EXISTS locked_run.holder (
  name text, token text, mode text, holders integer, fence bigint,
  host text, pid integer, command text, since timestamptz, expires_at timestamptz,
  PRIMARY KEY (name, token)
);
CREATE TABLE IF NOT EXISTS locked_run.queue (
  name text, token text, place bigint NOT NULL, mode text NOT NULL,
  racer boolean NOT NULL, alive_until timestamptz NOT NULL,
  PRIMARY KEY (name, token)
);
CREATE TABLE IF NOT EXISTS locked_run.buried (
  name text, token text, until timestamptz NOT NULL,
  PRIMARY KEY (name, token)
);
CREATE TABLE IF NOT EXISTS locked_run.history (
  name text, token text, ended_at timestamptz NOT NULL, run text NOT NULL,
  PRIMARY KEY (name, token)
);";

/// Every table of the lock.
pub const TABLE_NAMES: [&str; 5] = ["fence", "holder", "queue", "buried", "history"];

/// The transaction that makes them, serialised on [`CREATE_LOCK`].
pub fn create() -> String {
    format!(
        "SET LOCAL statement_timeout = 10000;\nSELECT pg_advisory_xact_lock({CREATE_LOCK});\n{TABLES}"
    )
}

/// Whether a server error says the tables (or the schema) are missing.
pub fn missing(code: &str) -> bool {
    // undefined_table, invalid_schema_name
    matches!(code, "42P01" | "3F000")
}

/// What an administrator runs for the role `role` when it may not create the tables: the
/// role (every holder and waiter keeps one connection while it runs: limit them), the tables,
/// and the grants.
pub fn for_an_administrator(role: &str) -> String {
    let role = quote_ident(role);
    format!(
        "-- as a superuser (or the database's owner), in the lock's database:\n\
         -- CREATE ROLE {role} LOGIN PASSWORD '...' CONNECTION LIMIT 200;\n\
         {TABLES}\n\
         GRANT USAGE ON SCHEMA locked_run TO {role};\n\
         GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA locked_run TO {role};"
    )
}

/// An identifier quoted for SQL.
pub fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}
