//! The lock's client of a PostgreSQL database: the connection it keeps (made on first use, on
//! the first host that is a primary, made again after any failure), each transaction sent
//! within its deadline, the tables made when a query found them missing, and every failure
//! turned into the backend's terms: what never reached the lock (no connection, a refused
//! login, a read-only standby, a transaction rolled back) is said to be unsent, so a first
//! contact that failed says nothing was taken; a commit whose wait for the synchronous standby
//! was cancelled is no acknowledgement.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

use tokio::time::Instant;

use super::conn::{self, Conn, Login, PgError, Row};
use super::schema;
use super::sql::Tx;
use super::url::{Host, PgUrl};
use crate::backend::BackendError;
use crate::endpoints::PasswordFrom;

/// A database, as the endpoints name it.
pub struct Client {
    pub url: PgUrl,
    pub login: Login,
    /// The password from the URL, `--password-file` or `PGPASSWORD`; else `~/.pgpass` is read
    /// for each host.
    pub password: Option<(String, PasswordFrom)>,
    pub connect_timeout: Duration,
    conn: RefCell<Option<Rc<Conn>>>,
}

impl Client {
    pub fn new(
        url: PgUrl,
        login: Login,
        password: Option<(String, PasswordFrom)>,
        connect_timeout: Duration,
    ) -> Client {
        Client {
            url,
            login,
            password,
            connect_timeout,
            conn: RefCell::new(None),
        }
    }

    /// The URL as it may be printed.
    pub fn shown(&self) -> &str {
        &self.url.shown
    }

    /// The connection in use, if one is open.
    pub fn current(&self) -> Option<Rc<Conn>> {
        self.conn.borrow().clone().filter(|c| !c.is_closed())
    }

    /// Forgets the connection: the next request makes a new one (and finds the primary again).
    pub fn drop_connection(&self) {
        self.conn.borrow_mut().take();
    }

    pub(super) fn password_for(&self, host: &Host) -> Option<(String, PasswordFrom)> {
        self.password.clone().or_else(|| {
            super::pgpass::lookup(
                host.pgpass_name(),
                host.port(),
                &self.login.dbname,
                &self.login.user,
            )
        })
    }

    /// The connection, made if need be on the first host that is a primary (asked only when
    /// several hosts are given: one host's writes say it themselves). Its errors never reached
    /// the lock.
    pub async fn connection(&self, deadline: Instant) -> Result<Rc<Conn>, BackendError> {
        if let Some(conn) = self.current() {
            return Ok(conn);
        }
        let several = self.url.hosts.len() > 1;
        let mut failures = Vec::new();
        for host in &self.url.hosts {
            let left = deadline.saturating_duration_since(Instant::now());
            let within = self.connect_timeout.min(left).max(Duration::from_millis(1));
            let password = self.password_for(host);
            let conn = match conn::connect(
                host,
                &self.login,
                password.as_ref().map(|(p, _)| p.as_str()),
                within,
            )
            .await
            {
                Ok(conn) => conn,
                Err(e) => {
                    failures.push(self.setup_error(host, e, password.map(|(_, from)| from)));
                    continue;
                }
            };
            if several {
                let asked = tokio::time::timeout(within, conn.run("SELECT pg_is_in_recovery()"));
                match asked.await {
                    Ok(Ok(sets)) if first(&sets) == Some("f") => {}
                    Ok(Ok(_)) => {
                        failures.push(BackendError::Transient(standby(host)));
                        continue;
                    }
                    Ok(Err(e)) => {
                        failures.push(self.setup_error(host, e, None));
                        continue;
                    }
                    Err(_) => {
                        failures.push(BackendError::Transient(crate::text::message!(
                            "PostgreSQL at {host} did not answer within {}",
                            crate::text::show(within)
                        )));
                        continue;
                    }
                }
            }
            let conn = Rc::new(conn);
            *self.conn.borrow_mut() = Some(conn.clone());
            return Ok(conn);
        }
        Err(match failures.len() {
            1 => failures.pop().expect("one"),
            _ => {
                let all: Vec<String> = failures.iter().map(ToString::to_string).collect();
                BackendError::Transient(crate::text::message!(
                    "no primary among the hosts of {}: {}",
                    self.shown(),
                    all.join("; ")
                ))
            }
        }
        .unsent())
    }

    pub(super) fn setup_error(
        &self,
        host: &Host,
        e: PgError,
        from: Option<PasswordFrom>,
    ) -> BackendError {
        match e {
            PgError::Io(why) if is_bounded_refusal(&why) => {
                BackendError::Transient(crate::text::message!("PostgreSQL at {host} sent {why}"))
            }
            PgError::Io(why) => BackendError::Transient(crate::text::message!(
                "cannot connect to PostgreSQL at {host}: {why}"
            )),
            PgError::Setup(why) if why.contains("password") => {
                let said = from.map_or_else(
                    || " (no password was given: the URL, --password-file, PGPASSWORD or ~/.pgpass)".to_owned(),
                    |from| format!(" (the password from {from})"),
                );
                BackendError::Refused(crate::text::message!(
                    "PostgreSQL at {host} refused the login: {why}{said}"
                ))
            }
            PgError::Setup(why) => BackendError::Refused(crate::text::message!(
                "PostgreSQL at {host} refused the connection: {why}"
            )),
            PgError::Db { message, .. } => BackendError::Refused(crate::text::message!(
                "PostgreSQL at {host} refused the connection: {message}"
            )),
        }
    }

    /// Runs `tx` within `deadline`; with `create`, the tables are made first when it finds them
    /// missing, and it runs once more.
    pub async fn exec(
        &self,
        tx: &Tx,
        deadline: Instant,
        create: bool,
    ) -> Result<Vec<Vec<Row>>, BackendError> {
        let sql = tx.sql();
        let sets = match self.exec_sql(&sql, deadline).await {
            Err(Failed::Missing(why)) if create => {
                self.create_tables(deadline, &why).await?;
                self.exec_sql(&sql, deadline)
                    .await
                    .map_err(Failed::into_error)
            }
            other => other.map_err(Failed::into_error),
        };
        sets.and_then(|sets| self.whole(tx, sets))
    }

    /// An answer with a result for every statement of `tx`, or an error: every caller reads
    /// the results by the statements' places, and a short answer (a connection that ended
    /// between two results) must not read as "no rows".
    fn whole(&self, tx: &Tx, sets: Vec<Vec<Row>>) -> Result<Vec<Vec<Row>>, BackendError> {
        if sets.len() >= tx.statements.len() {
            return Ok(sets);
        }
        self.drop_connection();
        Err(BackendError::Transient(crate::text::message!(
            "PostgreSQL answered {} of the {} statements it was sent",
            sets.len(),
            tx.statements.len()
        )))
    }

    /// Runs `tx` and, in the same round trip, `then` (a transaction of its own): `tx`'s answer,
    /// and `then`'s once it came, within `then_by` at the latest.
    pub async fn exec_then(
        &self,
        tx: &Tx,
        then: Option<&Tx>,
        deadline: Instant,
        then_by: Instant,
    ) -> (
        Result<Vec<Vec<Row>>, BackendError>,
        Option<Result<Vec<Vec<Row>>, BackendError>>,
    ) {
        let conn = match self.connection(deadline).await {
            Ok(conn) => conn,
            Err(e) => return (Err(e), None),
        };
        let host = conn.host.clone();
        let first = conn.send(&tx.sql()).await;
        let second = match then {
            Some(then) => Some(conn.send(&then.sql()).await),
            None => None,
        };
        let first = match first {
            Ok(sent) => self.answer(&conn, deadline, conn.collect(sent)).await,
            Err(e) => Err(self.failed(&host, e)),
        };
        let second = match second {
            Some(Ok(sent)) => Some(self.answer(&conn, then_by, conn.collect(sent)).await),
            Some(Err(e)) => Some(Err(self.failed(&host, e))),
            None => None,
        };
        let first = first
            .map_err(Failed::into_error)
            .and_then(|sets| self.whole(tx, sets));
        let second = second.zip(then).map(|(second, then)| {
            second
                .map_err(Failed::into_error)
                .and_then(|sets| self.whole(then, sets))
        });
        (first, second)
    }

    async fn exec_sql(&self, sql: &str, deadline: Instant) -> Result<Vec<Vec<Row>>, Failed> {
        let conn = self.connection(deadline).await.map_err(Failed::Error)?;
        let run = conn.run(sql);
        self.answer(&conn, deadline, run).await
    }

    /// The answer to a transaction, within `deadline`.
    async fn answer(
        &self,
        conn: &Conn,
        deadline: Instant,
        answer: impl std::future::Future<Output = Result<Vec<Vec<Row>>, PgError>>,
    ) -> Result<Vec<Vec<Row>>, Failed> {
        let before = conn.unconfirmed();
        let host = &conn.host;
        match tokio::time::timeout_at(deadline, answer).await {
            Err(_) => {
                conn.cancel().await;
                self.drop_connection();
                Err(Failed::Error(BackendError::Transient(
                    crate::text::message!("PostgreSQL at {host} did not answer in time"),
                )))
            }
            Ok(Err(e)) => Err(self.failed(host, e)),
            Ok(Ok(_)) if conn.unconfirmed() != before => {
                self.drop_connection();
                Err(Failed::Error(BackendError::Transient(
                    crate::text::message!(
                        "PostgreSQL at {host} committed but cancelled the wait for the synchronous \
                     standby: no acknowledgement (is the standby down?)"
                    ),
                )))
            }
            Ok(Ok(sets)) => Ok(sets),
        }
    }

    fn failed(&self, host: &Host, e: PgError) -> Failed {
        let (code, message) = match e {
            PgError::Io(why) => {
                self.drop_connection();
                let line = match is_bounded_refusal(&why) {
                    true => crate::text::message!("PostgreSQL at {host} sent {why}"),
                    false => {
                        crate::text::message!("lost the connection to PostgreSQL at {host}: {why}")
                    }
                };
                return Failed::Error(BackendError::Transient(line));
            }
            PgError::Setup(why) => {
                self.drop_connection();
                return Failed::Error(BackendError::Refused(why).unsent());
            }
            PgError::Db { code, message } => (code, message),
        };
        let message = crate::text::printable(&message);
        if schema::missing(&code) {
            return Failed::Missing(message);
        }
        // An error rolls the whole transaction back: nothing it asked for was taken.
        let error = match code.as_str() {
            "25006" => {
                self.drop_connection();
                BackendError::Transient(standby(host))
            }
            // serialization_failure, deadlock_detected, lock_not_available (lock_timeout),
            // query_canceled (statement_timeout)
            "40001" | "40P01" | "55P03" | "57014" => {
                BackendError::Transient(crate::text::message!("PostgreSQL at {host}: {message}"))
            }
            c if c.starts_with("08") || c.starts_with("57") || c.starts_with("53") => {
                self.drop_connection();
                BackendError::Transient(crate::text::message!("PostgreSQL at {host}: {message}"))
            }
            "42501" => BackendError::Refused(crate::text::message!(
                "PostgreSQL at {host} refused the role {}: {message}; `locked-run doctor` prints \
                 the grants it needs",
                self.login.user
            )),
            _ => BackendError::Refused(crate::text::message!("PostgreSQL at {host}: {message}")),
        };
        Failed::Error(error.unsent())
    }

    /// Makes the schema and tables (see `schema`): two first runs at once take turns.
    async fn create_tables(&self, deadline: Instant, missing: &str) -> Result<(), BackendError> {
        tracing::info!("the tables of locked-run are missing ({missing}): creating them");
        match self.exec_sql(&schema::create(), deadline).await {
            Ok(_) => Ok(()),
            Err(Failed::Error(e)) if e.to_string().contains("permission denied") => {
                Err(BackendError::Refused(crate::text::message!(
                    "the tables of locked-run are missing from {} and the role {} may not create \
                     them; `locked-run doctor` prints the SQL for an administrator",
                    self.shown(),
                    self.login.user
                ))
                .unsent())
            }
            Err(failed) => Err(failed.into_error()),
        }
    }
}

/// How a transaction failed.
enum Failed {
    /// The tables (or the schema) are missing.
    Missing(String),
    Error(BackendError),
}

impl Failed {
    fn into_error(self) -> BackendError {
        match self {
            Failed::Error(e) => e,
            Failed::Missing(why) => BackendError::Refused(crate::text::message!(
                "the tables of locked-run are missing ({why})"
            ))
            .unsent(),
        }
    }
}

/// The first column of the first row of the first result.
pub fn first(sets: &[Vec<Row>]) -> Option<&str> {
    sets.first()?.first()?.first()?.as_deref()
}

/// What the framing bound says of a reply it refused.
fn is_bounded_refusal(why: &str) -> bool {
    why.starts_with("a reply too large") || why.starts_with("a malformed reply")
}

fn standby(host: &Host) -> String {
    crate::text::message!(
        "PostgreSQL at {host} is a standby (in recovery, read-only): only a primary grants locks; \
         give the primary's address, or all of them (postgres://h1,h2/db)"
    )
}
