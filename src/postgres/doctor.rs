//! `doctor` on a PostgreSQL database, host by host: the connection (and whether TLS is on), the
//! primary, the server's version, the tables and the role's privileges on them (with the SQL
//! for an administrator when the role may neither use nor create them), `synchronous_commit`
//! and the standbys (what a failover would keep of the grants), and the connections left.

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
    format!("SELECT {}", columns.join(", "))
}

/// The checks of every host of the URL.
pub async fn checks(client: &Client, _name: &LockName) -> Vec<Check> {
    let mut checks = Vec::new();
    for host in &client.url.hosts {
        checks.extend(check_host(client, host).await);
    }
    checks
}

async fn check_host(client: &Client, host: &Host) -> Vec<Check> {
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
            return vec![line("connection", Level::Fail, why.to_string())];
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
            return checks;
        }
        Err(_) => {
            let detail = format!("no answer within {}", crate::text::show(timeout));
            checks.push(line("server", Level::Fail, detail));
            return checks;
        }
    };
    let text = |i: usize| row.get(i).cloned().flatten().unwrap_or_default();
    let flag = |i: usize| row.get(i).cloned().flatten().map(|v| v == "t");
    let number = |i: usize| text(i).parse::<i64>().ok();
    checks.push(match flag(0) {
        Some(false) => line("primary", Level::Ok, "a primary: it grants locks".into()),
        _ => line(
            "primary",
            Level::Fail,
            "a standby (in recovery, read-only): only a primary grants locks".into(),
        ),
    });
    checks.push(line(
        "version",
        Level::Ok,
        format!("PostgreSQL {}", text(1)),
    ));
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
    checks
}
