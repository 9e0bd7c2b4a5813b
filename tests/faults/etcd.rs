//! `etcd://` in the harness: one member, or a cluster of three (`etcd3`), each member behind a
//! fault proxy of its own, the URL listing them all. A member's faults are the ones a process
//! can suffer (SIGSTOP, SIGKILL and a restart with its data dir; one member alone also a
//! restart with it wiped), and a cluster's also hit its leader, whichever member leads at that
//! instant: killed and restarted, or stopped while the others elect another. `DEBUG SLEEP` has
//! no etcd counterpart.
//!
//! An etcd before 3.4.31 and 3.5.13 (Debian's 3.4.23) has a flaw of its own: a leader that
//! stalls longer than a lease and then resumes may propose the revoke of leases it thinks
//! expired, which the new leader commits though they were kept alive there (etcd issue 12528),
//! taking the lock from under a running command. On such an etcd a member is stopped for less
//! than the runs' lease (T = 2 s), where that cannot happen; on a fixed one, up to 4 s.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::backend::{Backend, Fault, Keeper, hostile, ms, proxy_fault};
use crate::hostile::Junk;
use crate::plan::TTL_MS;
use crate::proxy::{FaultProxy, Hostile};
use crate::rng::Rng;
use crate::support::etcd::revokes_after_a_stalled_leader;
use crate::support::{Etcd, signal};

pub struct Etcds {
    etcd: Arc<Mutex<Etcd>>,
    proxies: Vec<FaultProxy>,
    keeper: Keeper,
}

impl Etcds {
    /// `n` members (1 or 3), each behind a proxy.
    pub fn start(n: usize) -> Etcds {
        let keeper = Keeper::start();
        let etcd = Arc::new(Mutex::new(keeper.run(move || match n {
            1 => Etcd::start(),
            _ => Etcd::start_cluster(),
        })));
        let proxies = etcd
            .lock()
            .unwrap()
            .members
            .iter()
            .map(|m| FaultProxy::start(m.client_port))
            .collect();
        Etcds {
            etcd,
            proxies,
            keeper,
        }
    }

    /// Restarts member `i` on the keeper's thread (see [`Keeper`]).
    fn restart(&self, i: usize, wipe: bool) {
        let etcd = self.etcd.clone();
        self.keeper
            .run(move || etcd.lock().unwrap().restart(i, wipe));
    }

    /// The member that leads now, as the running members say; member `fallback` when they
    /// agree on none (an election under way).
    fn leader_or(&self, fallback: usize) -> (usize, &'static str) {
        let etcd = self.etcd.lock().unwrap();
        match etcd.leader_index() {
            Some(i) => (i, "the leader"),
            None => (fallback, "no leader agreed: a member"),
        }
    }

    /// The longest a member is stopped, in ms: `most`, or less than the runs' lease on an etcd
    /// whose stalled leader revokes live leases (see above); one member alone never loses
    /// its leadership, and is stopped as long as Redis is.
    fn longest_pause(&self, most: u64) -> u64 {
        match self.proxies.len() > 1 && revokes_after_a_stalled_leader() {
            true => most.min(TTL_MS - 300),
            false => most,
        }
    }

    fn pause(&self, i: usize, rng: &mut Rng, lo: u64, hi: u64) -> String {
        let d = ms(rng, lo, hi);
        let pid = self.etcd.lock().unwrap().members[i].pid();
        signal(pid, libc::SIGSTOP);
        std::thread::sleep(d);
        signal(pid, libc::SIGCONT);
        format!("{d:?}")
    }

    fn kill_restart(&self, i: usize, rng: &mut Rng) -> String {
        let down = ms(rng, 0, 1500);
        self.etcd.lock().unwrap().members[i].kill();
        self.proxies[i].reset_all();
        std::thread::sleep(down);
        self.restart(i, false);
        format!("down {down:?}")
    }

    /// `etcdctl ARGS -w json` against the members themselves (not through the proxies).
    fn ctl_json(etcd: &Etcd, args: &[&str]) -> Result<serde_json::Value, String> {
        let out = etcd.ctl(&[args, &["-w", "json"]].concat());
        if out.code() != Some(0) {
            return Err(format!("etcdctl {}: {out:?}", args.join(" ")));
        }
        serde_json::from_str(out.stdout.trim())
            .map_err(|e| format!("etcdctl {}: {e}", args.join(" ")))
    }
}

/// What a hostile member sends on one connection, in place of its HTTP/2: a frame announced as
/// 16 MiB (a client takes 16 KiB unless it says more), frames that continue headers never
/// begun, an HTTP/1.1 reply, a Redis reply.
fn etcd_hostile() -> Vec<Hostile> {
    let h = |what, prefix: &[u8], filler: &[u8]| Hostile {
        what,
        prefix: prefix.to_vec(),
        filler: filler.to_vec(),
    };
    vec![
        h(
            "an HTTP/2 frame of 16 MiB",
            &[0xff, 0xff, 0xff, 0, 0, 0, 0, 0, 1],
            b"x",
        ),
        h(
            "header continuations without end",
            &[0, 0x10, 0, 9, 0, 0, 0, 0, 1],
            &[0u8; 0x1000],
        ),
        h(
            "an HTTP/1.1 reply",
            b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n",
            b"",
        ),
        h("a Redis reply", b"-ERR unknown command\r\n", b""),
    ]
}

impl Backend for Etcds {
    fn label(&self) -> &'static str {
        match self.proxies.len() {
            1 => "etcd",
            _ => "etcd3",
        }
    }

    fn url_args(&self) -> Vec<String> {
        let endpoints: Vec<String> = self
            .proxies
            .iter()
            .map(|p| format!("127.0.0.1:{}", p.port))
            .collect();
        vec!["-u".to_owned(), format!("etcd://{}", endpoints.join(","))]
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
        let mut menu = vec![
            (Fault::DelayConn, 14),
            (Fault::Stall, 8),
            (Fault::BlackholeConn, 6),
            (Fault::BlackholeAll, 5),
            (Fault::ResetConn, 8),
            (Fault::ResetAll, 5),
            (Fault::Pause, 8),
            (Fault::KillRestart, 8),
            (Fault::Hostile, 6),
        ];
        match self.proxies.len() {
            // One member wiped is a new cluster: beyond its guarantee, and rare.
            1 => menu.push((Fault::RestartEmpty, 2)),
            _ => menu.extend([(Fault::KillLeader, 6), (Fault::PauseLeader, 6)]),
        }
        menu
    }

    fn servers(&self) -> usize {
        self.proxies.len()
    }

    fn inject(&self, fault: Fault, i: usize, rng: &mut Rng) -> String {
        let pick = rng.next_u64();
        match fault {
            Fault::Pause => self.pause(i, rng, 200, self.longest_pause(2500)),
            Fault::KillRestart => self.kill_restart(i, rng),
            Fault::PauseLeader => {
                let (leader, which) = self.leader_or(i);
                let longest = self.longest_pause(4000);
                format!(
                    "{which} {leader}: {}",
                    self.pause(leader, rng, 500, longest)
                )
            }
            Fault::KillLeader => {
                let (leader, which) = self.leader_or(i);
                format!("{which} {leader}: {}", self.kill_restart(leader, rng))
            }
            Fault::RestartEmpty => {
                self.restart(i, true);
                self.proxies[i].reset_all();
                String::new()
            }
            Fault::Hostile => hostile(&self.proxies[i], etcd_hostile(), pick, rng),
            // The connection faults are the proxy's, the same as on Redis.
            _ => proxy_fault(&self.proxies[i], fault, pick, rng),
        }
    }

    fn heal(&self) {
        let etcd = self.etcd.lock().unwrap();
        for member in etcd.members.iter().filter(|m| m.running()) {
            signal(member.pid(), libc::SIGCONT);
        }
    }

    /// Every key (the recipe's `NAME/<lease>`: etcd keeps no counter; the fence is a revision)
    /// and every lease must be gone once the leases lapsed.
    fn leftovers(&self) -> Vec<String> {
        let etcd = self.etcd.lock().unwrap();
        let mut left = Vec::new();
        match Etcds::ctl_json(&etcd, &["get", "--prefix", ""]) {
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
        match Etcds::ctl_json(&etcd, &["lease", "list"]) {
            Ok(reply) => {
                for lease in reply["leases"].as_array().into_iter().flatten() {
                    let id = lease["id"].as_i64().unwrap_or(0);
                    let hex = format!("{id:x}");
                    let ttl = Etcds::ctl_json(&etcd, &["lease", "timetolive", &hex])
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
        let reply = Etcds::ctl_json(&etcd, &["get", "--prefix", &format!("{name}/")])?;
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
