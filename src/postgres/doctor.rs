//! `doctor` on a PostgreSQL database, host by host: the connection (and whether TLS is on), the
//! primary, the server's version, the tables and the role's privileges on them (with the SQL
//! for an administrator when the role may neither use nor create them), `synchronous_commit`
//! and the standbys (what a failover would keep of the grants), and the connections left.
//! With several hosts (the recommended primary and synchronous standby), a standby is an OK
//! line with its replication state, and the hosts together must have one primary: none, or
//! more than one, is a FAIL.

use tokio::time::Instant;

use super::client::Client;
use super::conn::{self, PgError, Row};
use super::schema::{self, TABLE_NAMES};
use super::url::Host;
use crate::backend::{BackendError, Check, Level};
use crate::name::LockName;

/// One query for every check: one round trip per host.
fn question() -> String {
    let mut columns = vec![
        "pg_is_in_recovery()".to_owned(),
        "current_setting('server_version')".into(),
        "current_user".into(),
        "current_database()".into(),
        "current_setting('synchronous_commit')".into(),
        "current_setting('synchronous_standby_names')".into(),
        "(SELECT count(*) FROM pg_stat_replication)".into(),
        "current_setting('max_connections')::int - (SELECT count(*) FROM pg_stat_activity)".into(),
        "(SELECT rolconnlimit FROM pg_roles WHERE rolname = current_user)".into(),
        "(SELECT count(*) FROM pg_stat_activity WHERE usename = current_user)".into(),
        "has_database_privilege(current_database(), 'CREATE')".into(),
        "(SELECT has_schema_privilege(oid, 'USAGE') FROM pg_namespace WHERE nspname = 'locked_run')"
            .into(),
    ];
    for table in TABLE_NAMES {
        columns.push(format!(
            "(SELECT has_table_privilege(c, 'SELECT, INSERT, UPDATE, DELETE') \
             FROM to_regclass('locked_run.{table}') AS c WHERE c IS NOT NULL)"
        ));
    }
    // A standby's replication state (each null on a primary): what it has received and
    // replayed, how long ago the last transaction it replayed committed, and its WAL
    // receiver as pg_stat_wal_receiver shows it to a role that may see it.
    columns.extend([
        "pg_last_wal_receive_lsn()::text".into(),
        "pg_last_wal_replay_lsn()::text".into(),
        "round(extract(epoch FROM clock_timestamp() - pg_last_xact_replay_timestamp())::numeric, \
         1)::text"
            .into(),
        "(SELECT status || ' from ' || sender_host || ':' || sender_port FROM \
         pg_stat_wal_receiver WHERE status IS NOT NULL)"
            .into(),
    ]);
    format!("SELECT {}", columns.join(", "))
}

/// The column of [`question`] where the standby's columns start.
const STANDBY_AT: usize = 12 + TABLE_NAMES.len();

/// What a host turned out to be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    Primary,
    Standby,
    /// It did not answer, or not what it is.
    Unknown,
}

/// The checks of every host of the URL; with several, whether they have one primary.
pub async fn checks(client: &Client, _name: &LockName) -> Vec<Check> {
    let several = client.url.hosts.len() > 1;
    let mut checks = Vec::new();
    let mut roles = Vec::new();
    for host in &client.url.hosts {
        let (role, host_checks) = check_host(client, host, several).await;
        roles.push((host.to_string(), role));
        checks.extend(host_checks);
    }
    if several {
        checks.push(one_primary(&roles));
    }
    checks
}

/// The hosts' line: one primary and standbys is what locks need; no primary grants nothing,
/// and two grant the same lock twice.
fn one_primary(roles: &[(String, Role)]) -> Check {
    let of = |role: Role| -> Vec<&str> {
        roles
            .iter()
            .filter(|(_, r)| *r == role)
            .map(|(host, _)| host.as_str())
            .collect()
    };
    let (primaries, standbys) = (of(Role::Primary), of(Role::Standby));
    let (level, detail) = match primaries.as_slice() {
        [primary] => (
            Level::Ok,
            format!(
                "{primary} is the primary, {} standby(s): a run finds the primary among them",
                standbys.len()
            ),
        ),
        [] => (
            Level::Fail,
            crate::text::message!(
                "no host of the URL is a primary ({} standby(s), {} not answering): no lock can \
                 be taken until one is promoted",
                standbys.len(),
                of(Role::Unknown).len()
            ),
        ),
        many => (
            Level::Fail,
            crate::text::message!(
                "{} hosts of the URL are primaries ({}): a run takes the lock on whichever it \
                 reaches first, so two runs can hold it at once; fence off the old primary",
                many.len(),
                many.join(", ")
            ),
        ),
    };
    Check {
        server: "hosts".into(),
        check: "primary",
        level,
        detail,
    }
}

async fn check_host(client: &Client, host: &Host, several: bool) -> (Role, Vec<Check>) {
    let server = host.to_string();
    let line = |check: &'static str, level: Level, detail: String| Check {
        server: server.clone(),
        check,
        level,
        detail,
    };
    let timeout = client.connect_timeout;
    let password = client.password_for(host);
    let conn = match conn::connect(
        host,
        &client.login,
        password.as_ref().map(|(p, _)| p.as_str()),
        timeout,
    )
    .await
    {
        Ok(conn) => conn,
        Err(e) => {
            let why: BackendError = client.setup_error(host, e, password.map(|(_, from)| from));
            return (
                Role::Unknown,
                vec![line("connection", Level::Fail, why.to_string())],
            );
        }
    };
    let tls = match (conn.tls, &client.login.sslmode) {
        (true, mode) => format!("over TLS (sslmode={})", mode.word()),
        (false, mode) => format!("without TLS (sslmode={})", mode.word()),
    };
    let mut checks = vec![line(
        "connection",
        Level::Ok,
        format!(
            "connected as {} to database {} {tls}",
            client.login.user, client.login.dbname
        ),
    )];
    let asked = tokio::time::timeout_at(Instant::now() + timeout, conn.run(&question())).await;
    let row: Row = match asked {
        Ok(Ok(sets)) => sets
            .into_iter()
            .next()
            .and_then(|rows| rows.into_iter().next())
            .unwrap_or_default(),
        Ok(Err(e)) => {
            let said = match e {
                PgError::Db { code, message } => {
                    format!("{} (SQLSTATE {code})", crate::text::printable(&message))
                }
                PgError::Io(why) | PgError::Setup(why) => why,
            };
            checks.push(line("server", Level::Fail, said));
            return (Role::Unknown, checks);
        }
        Err(_) => {
            let detail = format!("no answer within {}", crate::text::show(timeout));
            checks.push(line("server", Level::Fail, detail));
            return (Role::Unknown, checks);
        }
    };
    let text = |i: usize| row.get(i).cloned().flatten().unwrap_or_default();
    let flag = |i: usize| row.get(i).cloned().flatten().map(|v| v == "t");
    let number = |i: usize| text(i).parse::<i64>().ok();
    let version = line("version", Level::Ok, format!("PostgreSQL {}", text(1)));
    match (flag(0), several) {
        (Some(false), _) => {
            checks.push(line(
                "primary",
                Level::Ok,
                "a primary: it grants locks".into(),
            ));
        }
        // Beside a primary, a standby is what a failover goes to: its state is what matters.
        (Some(true), true) => {
            let standby = |i: usize| row.get(STANDBY_AT + i).cloned().flatten();
            let (level, detail) = replication_state(
                standby(0),
                standby(1),
                standby(2),
                standby(3).map(|s| crate::text::printable(&s)),
            );
            checks.push(line("standby", level, detail));
            checks.push(version);
            return (Role::Standby, checks);
        }
        (found, _) => {
            checks.push(line(
                "primary",
                Level::Fail,
                "a standby (in recovery, read-only): only a primary grants locks".into(),
            ));
            let role = match found {
                Some(true) => Role::Standby,
                _ => Role::Unknown,
            };
            checks.push(version);
            return (role, checks);
        }
    }
    checks.push(version);
    let role = text(2);
    let may_create = flag(10) == Some(true);
    let tables: Vec<(&str, Option<bool>)> = TABLE_NAMES
        .iter()
        .enumerate()
        .map(|(i, t)| (*t, flag(12 + i)))
        .collect();
    let missing: Vec<&str> = tables
        .iter()
        .filter(|(_, p)| p.is_none())
        .map(|(t, _)| *t)
        .collect();
    let refused: Vec<&str> = tables
        .iter()
        .filter(|(_, p)| *p == Some(false))
        .map(|(t, _)| *t)
        .collect();
    let admin = schema::for_an_administrator(&role);
    checks.push(match (missing.is_empty(), may_create) {
        (true, _) => line("tables", Level::Ok, "locked_run.fence, holder, queue, buried and history are there".into()),
        (false, true) => line(
            "tables",
            Level::Ok,
            format!("missing ({}): the first run makes them (the role may create them)", missing.join(", ")),
        ),
        (false, false) => line(
            "tables",
            Level::Fail,
            format!(
                "missing ({}), and the role {role} may not create them; an administrator runs:\n{admin}",
                missing.join(", ")
            ),
        ),
    });
    let schema_usage = flag(11);
    checks.push(
        match (
            refused.is_empty() && schema_usage != Some(false),
            missing.len() == TABLE_NAMES.len(),
        ) {
            (true, _) => line(
                "privileges",
                Level::Ok,
                format!("the role {role} may read and write the lock's tables"),
            ),
            (false, _) => line(
                "privileges",
                Level::Fail,
                format!(
                    "the role {role} may not read and write locked_run.{}; an administrator runs:\n\
                 GRANT USAGE ON SCHEMA locked_run TO {q};\n\
                 GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA locked_run TO {q};",
                    if refused.is_empty() {
                        "*".to_owned()
                    } else {
                        refused.join(", locked_run.")
                    },
                    q = schema::quote_ident(&role)
                ),
            ),
        },
    );
    let (sync, names, standbys) = (text(4), text(5), number(6).unwrap_or(0));
    checks.push(match (standbys, names.trim().is_empty()) {
        (0, _) => line(
            "replication",
            Level::Ok,
            format!(
                "synchronous_commit = {sync} (each grant asks for on); no standby is connected: \
                 fences last as long as this server keeps its data"
            ),
        ),
        (n, false) => line(
            "replication",
            Level::Ok,
            format!(
                "{n} standby(s); synchronous_standby_names = '{names}': a grant commits only once \
                 a synchronous standby has it, so a failover to one keeps every grant"
            ),
        ),
        (n, true) => line(
            "replication",
            Level::Warn,
            format!(
                "{n} standby(s), all asynchronous (synchronous_standby_names is empty): a \
                 failover can lose grants, two holders at once; set synchronous_standby_names"
            ),
        ),
    });
    let (left, limit, used) = (
        number(7).unwrap_or(0),
        number(8).unwrap_or(-1),
        number(9).unwrap_or(0),
    );
    let role_left = (limit >= 0).then(|| limit - used);
    let least = role_left.map_or(left, |r| r.min(left));
    checks.push(line(
        "connections",
        if least < 10 { Level::Warn } else { Level::Ok },
        format!(
            "{left} left on the server{}: every holder and waiter keeps one while it runs",
            role_left.map_or_else(String::new, |r| format!(
                ", {r} for the role {role} (CONNECTION LIMIT {limit})"
            ))
        ),
    ));
    (Role::Primary, checks)
}

/// A standby's line: what it has received and replayed (the LSNs), how long ago the last
/// transaction it replayed committed, and its WAL receiver's state when the role may see it. A
/// standby that receives nothing (its WAL receiver down: it is not replicating) is a WARN.
fn replication_state(
    received: Option<String>,
    replayed: Option<String>,
    ago: Option<String>,
    receiver: Option<String>,
) -> (Level, String) {
    let replayed = replayed.unwrap_or_else(|| "nothing yet".into());
    let ago = ago.map_or_else(String::new, |s| format!(", its last transaction {s}s ago"));
    let receiver = receiver.map_or_else(String::new, |r| format!(", {r}"));
    match received {
        Some(received) => (
            Level::Ok,
            format!(
                "a standby (in recovery, read-only){receiver}: received WAL to {received}, \
                 replayed to {replayed}{ago}; a failover to it keeps what it has"
            ),
        ),
        None => (
            Level::Warn,
            format!(
                "a standby (in recovery, read-only) that receives no WAL: replayed to \
                 {replayed}{ago}; it is not replicating (is the primary reachable from it?)"
            ),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hosts(roles: &[Role]) -> Vec<(String, Role)> {
        roles
            .iter()
            .enumerate()
            .map(|(i, r)| (format!("h{i}:5432"), *r))
            .collect()
    }

    /// Issue 43: the README's primary and synchronous standby failed `doctor`. One primary
    /// beside standbys is OK; none, or two, is a FAIL.
    #[test]
    fn the_hosts_need_exactly_one_primary() {
        use Role::*;
        assert_eq!(one_primary(&hosts(&[Primary, Standby])).level, Level::Ok);
        assert_eq!(
            one_primary(&hosts(&[Standby, Primary, Standby])).level,
            Level::Ok
        );
        assert_eq!(one_primary(&hosts(&[Primary, Unknown])).level, Level::Ok);
        let none = one_primary(&hosts(&[Standby, Unknown]));
        assert_eq!(none.level, Level::Fail);
        assert!(none.detail.starts_with("no host of the URL is a primary"));
        let two = one_primary(&hosts(&[Primary, Primary]));
        assert_eq!(two.level, Level::Fail);
        assert!(
            two.detail
                .starts_with("2 hosts of the URL are primaries (h0:5432, h1:5432)")
        );
    }

    #[test]
    fn a_standby_that_receives_nothing_is_a_warning() {
        let some = |s: &str| Some(s.to_owned());
        let (level, detail) = replication_state(
            some("0/3000060"),
            some("0/3000060"),
            some("0.4"),
            some("streaming from p:5432"),
        );
        assert_eq!(level, Level::Ok);
        assert!(
            detail.contains(", streaming from p:5432: received WAL to 0/3000060"),
            "{detail}"
        );
        assert_eq!(
            replication_state(None, some("0/1"), None, None).0,
            Level::Warn
        );
    }
}
