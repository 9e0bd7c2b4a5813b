//! `doctor` on a PostgreSQL database, host by host: the connection (and whether TLS is on), the
//! primary, the server's version, the tables and the role's privileges on them (with the SQL
//! for an administrator when the role may neither use nor create them), `synchronous_commit`
//! and the standbys (what a failover would keep of the grants: see `replication`), and the
//! connections left. With several hosts (the recommended primary and synchronous standby), a
//! standby is a line with its replication state and what the primary says of it, and the
//! hosts together must have one primary: none, or more than one, is a FAIL.

use tokio::time::Instant;

use super::client::Client;
use super::conn::{self, PgError, Row};
use super::replication::{self, Primary, Replica, Standby};
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
        "(SELECT coalesce(json_agg(json_build_array(application_name, sync_state)), '[]') \
         FROM pg_stat_replication)::text"
            .into(),
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
        "(SELECT sender_host || ':' || sender_port FROM pg_stat_wal_receiver)".into(),
        "(SELECT conninfo FROM pg_stat_wal_receiver)".into(),
        "current_setting('cluster_name')".into(),
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

/// A host's checks, and what it said of replication: a primary's view of its standbys, or a
/// standby's own state (its line is made once every host answered).
struct Answer {
    role: Role,
    checks: Vec<Check>,
    primary: Option<Primary>,
    standby: Option<Standby>,
}

/// The checks of every host of the URL; with several, whether they have one primary, and what
/// a failover to each standby keeps, as the primary says.
pub async fn checks(client: &Client, _name: &LockName) -> Vec<Check> {
    let several = client.url.hosts.len() > 1;
    let mut answers = Vec::new();
    for host in &client.url.hosts {
        answers.push((host.to_string(), check_host(client, host, several).await));
    }
    let primaries: Vec<&Primary> = answers
        .iter()
        .filter_map(|(_, a)| a.primary.as_ref())
        .collect();
    let primary = match primaries.as_slice() {
        [one] => Some((*one).clone()),
        _ => None,
    };
    let roles: Vec<(String, Role)> = answers.iter().map(|(h, a)| (h.clone(), a.role)).collect();
    let mut checks = Vec::new();
    for (host, mut answer) in answers {
        if let Some(standby) = &answer.standby {
            let (level, detail) = replication::standby_line(standby, primary.as_ref());
            let line = Check {
                server: host,
                check: "standby",
                level,
                detail,
            };
            answer.checks.insert(1.min(answer.checks.len()), line);
        }
        checks.extend(answer.checks);
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

async fn check_host(client: &Client, host: &Host, several: bool) -> Answer {
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
            return unknown(vec![line("connection", Level::Fail, why.to_string())]);
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
            return unknown(checks);
        }
        Err(_) => {
            let detail = format!("no answer within {}", crate::text::show(timeout));
            checks.push(line("server", Level::Fail, detail));
            return unknown(checks);
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
        // Beside a primary, a standby is what a failover goes to: its state, and what the
        // primary says of it, are what matter (its line is made once every host answered).
        (Some(true), true) => {
            let standby = |i: usize| row.get(STANDBY_AT + i).cloned().flatten();
            let printable = |i: usize| standby(i).map(|s| crate::text::printable(&s));
            checks.push(version);
            return Answer {
                role: Role::Standby,
                checks,
                primary: None,
                standby: Some(Standby {
                    received: standby(0),
                    replayed: standby(1),
                    ago: standby(2),
                    receiver: printable(3),
                    sender: standby(4),
                    name: Standby::name_of(standby(5).as_deref(), standby(6).as_deref()),
                }),
            };
        }
        (Some(true), false) => {
            checks.push(line(
                "primary",
                Level::Fail,
                "a standby (in recovery, read-only): only a primary grants locks".into(),
            ));
            checks.push(version);
            return Answer {
                role: Role::Standby,
                checks,
                primary: None,
                standby: None,
            };
        }
        (None, _) => {
            checks.push(line(
                "primary",
                Level::Fail,
                "it did not say whether it is in recovery (no answer to pg_is_in_recovery()): \
                 neither a primary nor a standby as far as locks can tell"
                    .into(),
            ));
            checks.push(version);
            return unknown(checks);
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
    let replicas = serde_json::from_str::<Vec<(Option<String>, Option<String>)>>(&text(6))
        .unwrap_or_default()
        .into_iter()
        .map(|(name, sync_state)| Replica { name, sync_state })
        .collect();
    let primary = Primary {
        address: server.clone(),
        synchronous_commit: text(4),
        standby_names: crate::text::printable(&text(5)),
        replicas,
    };
    let (level, detail) = replication::primary_line(&primary);
    checks.push(line("replication", level, detail));
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
    Answer {
        role: Role::Primary,
        checks,
        primary: Some(primary),
        standby: None,
    }
}

/// A host that did not tell what it is.
fn unknown(checks: Vec<Check>) -> Answer {
    Answer {
        role: Role::Unknown,
        checks,
        primary: None,
        standby: None,
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
}
