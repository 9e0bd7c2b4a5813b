//! The `etcd://` backend of the harness: one etcd member behind a fault proxy; its server
//! faults, what a hostile gateway answers, and what is left once everything stopped.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::backend::{Backend, Fault, Keeper, hostile, ms, proxy_fault};
use crate::hostile::Junk;
use crate::proxy::{FaultProxy, Hostile};
use crate::rng::Rng;
use crate::support::{Etcd, signal};

/// `etcd://`: one etcd member behind a fault proxy. Its server faults are the ones a process
/// can suffer (SIGSTOP, SIGKILL and a restart with its data dir, a restart with it wiped);
/// `DEBUG SLEEP` has no etcd counterpart.
pub struct EtcdMember {
    etcd: Arc<Mutex<Etcd>>,
    proxy: FaultProxy,
    keeper: Keeper,
}

impl EtcdMember {
    pub fn start() -> EtcdMember {
        let keeper = Keeper::start();
        let etcd = Arc::new(Mutex::new(keeper.run(Etcd::start)));
        let port = etcd.lock().unwrap().members[0].client_port;
        EtcdMember {
            etcd,
            proxy: FaultProxy::start(port),
            keeper,
        }
    }

    /// Restarts the member on the keeper's thread (see [`Keeper`]).
    fn restart(&self, wipe: bool) {
        let etcd = self.etcd.clone();
        self.keeper
            .run(move || etcd.lock().unwrap().restart(0, wipe));
    }

    /// `etcdctl ARGS -w json` against the member itself (not through the proxy), parsed.
    fn ctl_json(etcd: &Etcd, args: &[&str]) -> Result<serde_json::Value, String> {
        let out = etcd.ctl(&[args, &["-w", "json"]].concat());
        if out.code() != Some(0) {
            return Err(format!("etcdctl {}: {out:?}", args.join(" ")));
        }
        serde_json::from_str(out.stdout.trim())
            .map_err(|e| format!("etcdctl {}: {e}", args.join(" ")))
    }
}

/// What a hostile etcd gateway answers: a body of 40 GB, an endless chunked body, a header that
/// never ends, and a Redis reply.
fn etcd_hostile() -> Vec<Hostile> {
    let mut chunk = b"1000\r\n".to_vec();
    chunk.extend(std::iter::repeat_n(b'x', 0x1000));
    chunk.extend_from_slice(b"\r\n");
    let h = |what, prefix: &[u8], filler: &[u8]| Hostile {
        what,
        prefix: prefix.to_vec(),
        filler: filler.to_vec(),
    };
    vec![
        h(
            "a body of 40 GB",
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 40000000000\r\n\r\n{\"x\":\"",
            b"x",
        ),
        h(
            "an endless chunked body",
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n",
            &chunk,
        ),
        h("a header that never ends", b"HTTP/1.1 200 OK\r\nX-A: ", b"a"),
        h("a Redis reply", b"-ERR unknown command\r\n", b""),
    ]
}

impl Backend for EtcdMember {
    fn label(&self) -> &'static str {
        "etcd"
    }

    fn url_args(&self) -> Vec<String> {
        vec![
            "-u".to_owned(),
            format!("etcd://127.0.0.1:{}", self.proxy.port),
        ]
    }

    fn holders_ok(&self) -> bool {
        true
    }

    fn fair_order(&self) -> bool {
        // Each waiter watches the key created just before its own: arrival order, and
        // --no-fair is accepted but changes nothing.
        true
    }

    fn faults(&self) -> Vec<(Fault, u64)> {
        vec![
            (Fault::DelayConn, 14),
            (Fault::Stall, 8),
            (Fault::BlackholeConn, 6),
            (Fault::BlackholeAll, 5),
            (Fault::ResetConn, 8),
            (Fault::ResetAll, 5),
            (Fault::Pause, 8),
            (Fault::KillRestart, 8),
            (Fault::RestartEmpty, 2),
            (Fault::Hostile, 6),
        ]
    }

    fn servers(&self) -> usize {
        1
    }

    fn inject(&self, fault: Fault, _: usize, rng: &mut Rng) -> String {
        let pick = rng.next_u64();
        match fault {
            Fault::Pause => {
                let d = ms(rng, 200, 2500);
                let pid = self.etcd.lock().unwrap().members[0].pid();
                signal(pid, libc::SIGSTOP);
                std::thread::sleep(d);
                signal(pid, libc::SIGCONT);
                format!("{d:?}")
            }
            Fault::KillRestart => {
                let down = ms(rng, 0, 1500);
                self.etcd.lock().unwrap().members[0].kill();
                self.proxy.reset_all();
                std::thread::sleep(down);
                self.restart(false);
                format!("down {down:?}")
            }
            Fault::RestartEmpty => {
                self.restart(true);
                self.proxy.reset_all();
                String::new()
            }
            Fault::DebugSleep => unreachable!("not on etcd's menu"),
            Fault::Hostile => hostile(&self.proxy, etcd_hostile(), pick, rng),
            // The connection faults are the proxy's, the same as on Redis.
            _ => proxy_fault(&self.proxy, fault, pick, rng),
        }
    }

    fn heal(&self) {
        let etcd = self.etcd.lock().unwrap();
        if etcd.members[0].running() {
            signal(etcd.members[0].pid(), libc::SIGCONT);
        }
    }

    /// Every key (the recipe's `NAME/<lease>`: etcd keeps no counter; the fence is a revision)
    /// and every lease must be gone once the leases lapsed.
    fn leftovers(&self) -> Vec<String> {
        let etcd = self.etcd.lock().unwrap();
        let mut left = Vec::new();
        match EtcdMember::ctl_json(&etcd, &["get", "--prefix", ""]) {
            Ok(reply) => {
                for kv in reply["kvs"].as_array().into_iter().flatten() {
                    let key = kv["key"].as_str().map_or_else(String::new, base64_text);
                    // The NAMEs' histories stay, as they are meant to.
                    if key.starts_with("locked-run/history/") {
                        continue;
                    }
                    left.push(format!(
                        "key {key} left (create revision {}, lease {:x})",
                        kv["create_revision"].as_i64().unwrap_or(0),
                        kv["lease"].as_i64().unwrap_or(0)
                    ));
                }
            }
            Err(e) => left.push(format!("keys not readable: {e}")),
        }
        match EtcdMember::ctl_json(&etcd, &["lease", "list"]) {
            Ok(reply) => {
                for lease in reply["leases"].as_array().into_iter().flatten() {
                    let id = lease["id"].as_i64().unwrap_or(0);
                    let hex = format!("{id:x}");
                    let ttl = EtcdMember::ctl_json(&etcd, &["lease", "timetolive", &hex])
                        .map(|r| format!("TTL {} s of {} s", r["ttl"], r["granted-ttl"]))
                        .unwrap_or_else(|e| e);
                    left.push(format!("lease {hex} left ({ttl})"));
                }
            }
            Err(e) => left.push(format!("leases not readable: {e}")),
        }
        left
    }

    /// A key of NAME's history, named as a run's is (the instant, then a token).
    fn plant_history(&self, name: &str, junk: &Junk, token: &str) -> Result<(), String> {
        use std::io::Write as _;
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis());
        let key = format!("locked-run/history/{name}/{now_ms:016}-{token}");
        let mut put = self.etcd.lock().unwrap().ctl_command(&["put", &key]);
        put.stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null());
        let mut child = put.spawn().map_err(|e| e.to_string())?;
        let written = child
            .stdin
            .take()
            .map(|mut stdin| stdin.write_all(junk.record(token).as_bytes()));
        let pid = child.id() as i32;
        if !crate::support::wait_pid_exit(pid, Duration::from_secs(10)) {
            signal(pid, libc::SIGKILL);
        }
        let status = child.wait().map_err(|e| e.to_string())?;
        match (written, status.success()) {
            (Some(Ok(())), true) => Ok(()),
            _ => Err(format!("etcdctl put {key}: {status}")),
        }
    }

    /// The first holder's key (`NAME/<lease>`, its value the holder's JSON), rewritten on its
    /// lease with `since` far ahead.
    fn plant_far_since(&self, name: &str) -> Result<(), String> {
        let etcd = self.etcd.lock().unwrap();
        let reply = EtcdMember::ctl_json(&etcd, &["get", "--prefix", &format!("{name}/")])?;
        let Some(kv) = reply["kvs"].as_array().and_then(|kvs| kvs.first()) else {
            return Ok(());
        };
        let text = |field: &str| kv[field].as_str().map_or_else(String::new, base64_text);
        let mut value: serde_json::Value =
            serde_json::from_str(&text("value")).map_err(|e| e.to_string())?;
        value["since"] = crate::hostile::FAR_SINCE_MS.into();
        let out = etcd.ctl(&["put", "--ignore-lease", &text("key"), &value.to_string()]);
        match out.code() {
            Some(0) => Ok(()),
            _ => Err(format!("etcdctl put: {out:?}")),
        }
    }
}

fn base64_text(text: &str) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD
        .decode(text)
        .map_or_else(
            |_| text.to_owned(),
            |b| String::from_utf8_lossy(&b).into_owned(),
        )
}
