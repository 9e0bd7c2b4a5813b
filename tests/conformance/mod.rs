//! The conformance suite: every promise a user can observe, written once and run, unchanged,
//! against every backend (one test per promise and backend: `conformance::BACKEND::PROMISE`).
//! A backend that declares it cannot keep a promise must refuse the mode when it is opened,
//! and the suite checks that refusal instead. Each test starts a store of its own.
//!
//! Adding a backend: its fixture (an `impl Backend` in a file of `backends/`: what it supports,
//! how its store starts, where nothing of its kind answers, a hostile store of its kind) and one
//! line below, `mod NAME { every_promise!(FIXTURE); }`. Adding a promise: its module, and one
//! entry in `every_promise!`. CONTRIBUTING lists the promises.

mod backends;
mod store;

mod busy;
mod dead_holder;
mod dead_waiter;
mod environment;
mod exclusive;
mod fair;
mod far_since;
mod history;
mod history_bounds;
mod history_order;
mod holders;
mod hostile;
mod json_keys;
mod lost;
mod max_run;
mod metrics;
mod metrics_dir;
mod min_hold;
mod shared;
mod signalled_waiter;
mod unreachable;
mod wait_runs_out;

/// One test per promise, each against a store of `$backend`'s own.
macro_rules! every_promise {
    ($backend:expr) => {
        use crate::conformance::*;

        #[test]
        fn busy() {
            busy::check(&$backend)
        }

        #[test]
        fn wait_runs_out() {
            wait_runs_out::check(&$backend)
        }

        #[test]
        fn exclusive() {
            exclusive::check(&$backend)
        }

        #[test]
        fn fair() {
            fair::check(&$backend)
        }

        #[test]
        fn signalled_waiter() {
            signalled_waiter::check(&$backend)
        }

        #[test]
        fn dead_waiter() {
            dead_waiter::check(&$backend)
        }

        #[test]
        fn dead_holder() {
            dead_holder::check(&$backend)
        }

        #[test]
        fn lost() {
            lost::check(&$backend)
        }

        #[test]
        fn holders() {
            holders::check(&$backend)
        }

        #[test]
        fn shared() {
            shared::check(&$backend)
        }

        #[test]
        fn max_run() {
            max_run::check(&$backend)
        }

        #[test]
        fn min_hold() {
            min_hold::check(&$backend)
        }

        #[test]
        fn environment() {
            environment::check(&$backend)
        }

        #[test]
        fn json_keys() {
            json_keys::check(&$backend)
        }

        #[test]
        fn far_since() {
            far_since::check(&$backend)
        }

        #[test]
        fn history() {
            history::check(&$backend)
        }

        #[test]
        fn history_bounds() {
            history_bounds::check(&$backend)
        }

        #[test]
        fn history_order() {
            history_order::check(&$backend)
        }

        #[test]
        fn metrics() {
            metrics::check(&$backend)
        }

        #[test]
        fn metrics_dir() {
            metrics_dir::check(&$backend)
        }

        #[test]
        fn unreachable() {
            unreachable::check(&$backend)
        }

        #[test]
        fn hostile() {
            hostile::check(&$backend)
        }
    };
}

mod file {
    every_promise!(backends::File);
}

mod redis {
    every_promise!(backends::OneRedis);
}

mod sentinel {
    every_promise!(backends::Sentinel);
}

mod cluster {
    every_promise!(backends::RedisCluster);
}

mod redlock {
    every_promise!(backends::Redlock);
}

mod etcd {
    every_promise!(backends::OneEtcd);
}

mod postgres {
    every_promise!(backends::OnePostgres);
}

/// The fake backend: `cargo test --features fake-backend --test integration conformance::fake`.
#[cfg(feature = "fake-backend")]
mod fake {
    every_promise!(backends::Fake);
}
