//! `postgres://` in its modes, beyond what the conformance suite asks of every backend (arrival
//! order, `--holders N`, `--shared`): `--min-hold` lapsing by itself, `--max-run`, `--no-fair`
//! racers behind fair waiters, `release --force`; and behind PgBouncer in transaction mode,
//! where notifications may not arrive: waiting stays correct and in arrival order, only slower.

use std::os::unix::process::CommandExt;
use std::time::Duration;

use crate::support::postgres::Postgres;
use crate::support::*;

/// Waits until `n` waiters hold places in the queue of `name`.
fn queued(pg: &Postgres, name: &str, n: usize) {
    wait_until("the waiters' places", Duration::from_secs(20), || {
        pg.psql(&format!(
            "SELECT count(*) FROM locked_run.queue WHERE name = '{name}' AND alive_until > clock_timestamp()"
        )) == n.to_string()
    });
}

/// Runs `a`, `b`, `c` queue behind a holder one after the other; released, they run in that
/// order.
fn served_in_arrival_order(pg: &Postgres, url: &str) {
    let dir = scratch();
    let holder = logged(url, dir.path(), "h", &[]);
    wait_until("the holder", Duration::from_secs(10), || {
        log_of(dir.path()).contains("start h")
    });
    let mut waiters = Vec::new();
    for (i, who) in ["a", "b", "c"].into_iter().enumerate() {
        waiters.push(logged(url, dir.path(), who, &["-w", "60s"]));
        queued(pg, "job", i + 1);
    }
    for who in ["h", "a", "b", "c"] {
        go(dir.path(), who);
    }
    holder.wait().expect(0);
    for w in waiters {
        w.wait().expect(0);
    }
    let order: Vec<String> = log_of(dir.path())
        .lines()
        .filter(|l| l.starts_with("start"))
        .map(|l| l.split_whitespace().nth(1).unwrap().to_owned())
        .collect();
    assert_eq!(order, ["h", "a", "b", "c"]);
}

#[test]
fn min_hold_keeps_the_lock_and_max_run_stops_the_command() {
    let pg = Postgres::start();
    let url = pg.url();
    lr().url(&url)
        .args(["--min-hold", "2s"])
        .job(["true"])
        .run()
        .expect(0);
    lr().url(&url)
        .args(["-n", "-v"])
        .job(["true"])
        .run()
        .expect(75);
    lr().url(&url)
        .args(["-w", "10s"])
        .job(["true"])
        .run()
        .expect(0);
    lr().url(&url)
        .args(["--max-run", "300ms"])
        .job(["sleep", "10"])
        .run()
        .expect(124);
    lr().url(&url).args(["-n"]).job(["true"]).run().expect(0);
}

#[test]
fn a_racer_waits_behind_fair_waiters_and_force_release_frees_the_lock() {
    let pg = Postgres::start();
    let url = pg.url();
    let holder = Holder::start_on(&url, "job", &[]);
    let racer = lr()
        .url(&url)
        .args(["--no-fair", "-w", "30s"])
        .job(["true"])
        .spawn();
    queued(&pg, "job", 1);
    let out = lr()
        .args(["release", "--force", "-u", &url, "job"])
        .run()
        .expect(0);
    assert!(
        out.stdout.starts_with("released lock job, held by"),
        "{}",
        out.stdout
    );
    racer.wait().expect(0);
    // The holder learns at its next renewal that the lock was taken away.
    holder.running.wait_for(Duration::from_secs(30)).expect(76);
}

/// PgBouncer in transaction mode: a LISTEN goes to whichever server connection the pooler
/// lends, so notifications may never reach the waiter; it asks again every keep-alive/3.
#[test]
fn behind_pgbouncer_in_transaction_mode_waiters_are_served_in_order() {
    let pg = Postgres::start();
    let dir = scratch();
    let port = free_port();
    let ini = dir.path().join("pgbouncer.ini");
    std::fs::write(
        &ini,
        format!(
            "[databases]\npostgres = host=127.0.0.1 port={pg} dbname=postgres user=postgres\n\
             [pgbouncer]\nlisten_addr = 127.0.0.1\nlisten_port = {port}\nauth_type = trust\n\
             auth_file = {d}/users\npool_mode = transaction\nunix_socket_dir =\n\
             max_client_conn = 100\ndefault_pool_size = 4\nlogfile = {d}/log\n",
            pg = pg.port,
            d = path_str(dir.path())
        ),
    )
    .unwrap();
    std::fs::write(dir.path().join("users"), "\"postgres\" \"\"\n").unwrap();
    // PgBouncer refuses to run as root: as the server's user, which must read its files.
    let id = |flag: &str| -> u32 {
        let out = std::process::Command::new("id")
            .args([flag, "postgres"])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
    };
    for path in [
        dir.path().to_path_buf(),
        ini.clone(),
        dir.path().join("users"),
    ] {
        std::os::unix::fs::chown(&path, Some(id("-u")), Some(id("-g"))).unwrap();
    }
    let bouncer = std::process::Command::new("pgbouncer")
        .uid(id("-u"))
        .gid(id("-g"))
        .arg(&ini)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("pgbouncer is installed (see .ci/run)");
    let bouncer = KillOnDrop(bouncer);
    wait_until("pgbouncer", Duration::from_secs(10), || {
        std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
    });
    let url = format!("postgres://postgres@127.0.0.1:{port}/postgres?sslmode=disable");
    lr().url(&url).job(["true"]).run().expect(0);
    served_in_arrival_order(&pg, &url);
    drop(bouncer);
}

struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
