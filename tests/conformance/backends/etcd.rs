//! `etcd://` as the conformance suite runs it: one member.

use super::{Backend, HostileStore, Servers, Store, Supports, one_hostile, url_args};
use crate::support::hostile;
use crate::support::*;

/// One etcd member.
pub struct OneEtcd;

impl Servers for Etcd {
    fn add_history_record(&self, record: &str) {
        // Keys sort by when the run let go: this one is the newest.
        let ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis();
        let key = format!("locked-run/history/job/{ms:016}-forged{}", record.len());
        self.ctl(&["put", &key, record]).expect(0);
    }

    /// A key that sorts after every run's (`~` after the digits they start with).
    fn add_history_record_ahead(&self, record: &str) {
        let key = format!("locked-run/history/job/~forged-{:x}", fnv(record));
        self.ctl(&["put", &key, record]).expect(0);
    }

    /// The holder's key (`job/<lease>`, its value the holder's JSON), rewritten in place,
    /// still on its lease.
    fn plant_far_since(&self) {
        let out = self
            .ctl(&["get", "--prefix", "job/", "-w", "json"])
            .expect(0);
        let kv = &out.json()["kvs"][0];
        let text = |field: &str| {
            use base64::Engine as _;
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(kv[field].as_str().unwrap())
                .unwrap();
            String::from_utf8(bytes).unwrap()
        };
        let mut value: serde_json::Value = serde_json::from_str(&text("value")).unwrap();
        value["since"] = super::FAR_SINCE_MS.into();
        self.ctl(&["put", "--ignore-lease", &text("key"), &value.to_string()])
            .expect(0);
    }
}

/// A short hash of `text`, to give each forged record a key of its own.
fn fnv(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

impl Backend for OneEtcd {
    fn supports(&self) -> Supports {
        Supports::EVERYTHING
    }

    fn start(&self) -> Store {
        let etcd = Etcd::start();
        Store::at(etcd.url(), etcd)
    }

    fn unreachable(&self) -> Vec<String> {
        url_args("etcd://127.0.0.1:1".into())
    }

    /// A server whose first HTTP/2 frame announces 16 MiB (a client takes 16 KiB unless it
    /// says more).
    fn hostile(&self) -> Option<HostileStore> {
        one_hostile(
            hostile::h2_frame_too_large,
            |port| format!("etcd://127.0.0.1:{port}"),
            "sent a malformed reply",
        )
    }
}
