//! Holding a lock from Rust with the library: the lock is waited for as the command line waits,
//! kept in the background on the lease clock, and the work stops when the lease may be lost.
//!
//!     cargo run --example guard -- redis://127.0.0.1:6379 nightly-report
//!
//! Any URL the command line takes works (etcd://, file:///DIR, several redis:// for Redlock).

use std::time::Duration;

use locked_run::{Endpoints, Lock, Options, Stop};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let url = args
        .next()
        .unwrap_or_else(|| "redis://127.0.0.1:6379".into());
    let name = args.next().unwrap_or_else(|| "nightly-report".into());

    let mut options = Options::new(Duration::from_secs(30));
    options.wait = Some(Duration::from_secs(60));
    let lock = Lock::open(&Endpoints::new([url]), &name, &options)?;
    let mut guard = lock.hold().await?;
    let fence = guard.fence();
    println!("holding {name} with fence {fence}");

    tokio::select! {
        stop = guard.stop_now() => match stop {
            Stop::Expiring => eprintln!("the lease could not be renewed: stopping before it ends"),
            Stop::Lost => eprintln!("the lock was taken away: stopping now"),
        },
        () = work(fence) => println!("done"),
    }
    println!("released: {}", guard.release().await?);
    Ok(())
}

/// The protected work: every write carries `fence`, so that the storage can refuse a writer
/// whose lease ran out while it was paused.
async fn work(fence: u64) {
    for step in 1..=3 {
        println!("step {step} (writing with fence {fence})");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
