//! How long reading one big reply takes on the own RESP client (`Connection`, src/redis/resp)
//! and on the `redis` crate's parser, each reading the same reply from a loopback TCP server
//! that writes it in 4 KiB pieces (a 4 MB array once took the own client 8 to 15 s, as it
//! parsed the reply again from its start after every read).
//!
//!     cargo run --release --example resp_parse [RUNS]
//!
//! Two replies: an array of 100 000 bulk strings, and one bulk string, 4 MB each. Each is
//! read RUNS times (5 unless given) by each client, on a fresh connection each time, and the
//! median is printed: from sending the request to holding the parsed reply. The server is a
//! thread of its own, so on a machine of two cores or more it does not take the client's time.
//! The peak RSS printed is the process's (the server's copy of the reply included), reset
//! before each client's runs through /proc/self/clear_refs.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::ExitCode;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use locked_run::internals::redis::resp::{Addr, Connection, Reply};
use tokio::io::AsyncWriteExt;

/// The size of the server's writes.
const PIECE: usize = 4096;
/// What each client sends (the server answers anything with the reply).
const REQUEST: &[u8] = b"*2\r\n$3\r\nGET\r\n$3\r\nbig\r\n";

fn main() -> ExitCode {
    let runs = match std::env::args().nth(1).map(|n| n.parse::<usize>()) {
        None => 5,
        Some(Ok(runs)) if runs > 0 => runs,
        Some(_) => {
            eprintln!("usage: resp_parse [RUNS]");
            return ExitCode::from(2);
        }
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    match runtime.block_on(compare(runs)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("resp_parse: {err}");
            ExitCode::FAILURE
        }
    }
}

async fn compare(runs: usize) -> Result<(), String> {
    let strings = 100_000;
    let mut array = format!("*{strings}\r\n").into_bytes();
    for i in 0..strings {
        // 40 bytes each, the header and CRLF included.
        array.extend_from_slice(format!("$33\r\n{i:033}\r\n").as_bytes());
    }
    let mut string = b"$4000000\r\n".to_vec();
    string.resize(string.len() + 4_000_000, b'x');
    string.extend_from_slice(b"\r\n");

    let replies = [
        (format!("array of {strings} bulk strings"), array),
        ("bulk string".to_owned(), string),
    ];
    for (what, reply) in replies {
        let len = reply.len();
        let server = Server::start(Arc::new(reply))?;
        let (own, own_rss) = timed(runs, || own_client(&server, len)).await?;
        let (crate_, crate_rss) = timed(runs, || redis_crate(&server, len)).await?;
        println!(
            "own client: {:.1} MB {what} read in {} ms; redis crate parser: {} ms",
            len as f64 / 1e6,
            millis(own),
            millis(crate_),
        );
        if let (Some(own_rss), Some(crate_rss)) = (own_rss, crate_rss) {
            println!("  peak RSS: own client {own_rss} MB; redis crate parser {crate_rss} MB");
        }
    }
    Ok(())
}

/// The median of `runs` runs of `read`, and the peak RSS meanwhile, in MB, where Linux tells.
async fn timed<F, Fut>(runs: usize, mut read: F) -> Result<(Duration, Option<u64>), String>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Duration, String>>,
{
    // Writing 5 resets the peak RSS (VmHWM) to the current RSS.
    let reset = std::fs::write("/proc/self/clear_refs", "5").is_ok();
    let mut times = Vec::with_capacity(runs);
    for _ in 0..runs {
        times.push(read().await?);
    }
    times.sort();
    let peak = reset.then(peak_rss_mb).flatten();
    Ok((times[runs / 2], peak))
}

fn peak_rss_mb() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024)
}

fn millis(d: Duration) -> String {
    format!("{:.1}", d.as_secs_f64() * 1e3)
}

/// The own client, as locked-run reads a reply: `Connection::command`.
async fn own_client(server: &Server, len: usize) -> Result<Duration, String> {
    let mut conn = Connection::connect(&server.addr(), None)
        .await
        .map_err(|e| format!("connecting: {e}"))?;
    let start = Instant::now();
    let reply = conn
        .command(&[b"GET", b"big"])
        .await
        .map_err(|e| format!("own client: {e}"))?;
    let took = start.elapsed();
    let got = match &reply {
        Reply::Array(Some(items)) => items.len(),
        Reply::Bulk(Some(bytes)) => bytes.len(),
        other => return Err(format!("own client: read {other:?}")),
    };
    check(got, len)?;
    Ok(took)
}

/// The `redis` crate's parser over the same kind of socket, as its async connections read:
/// `parse_redis_value_async` on a tokio `TcpStream`.
async fn redis_crate(server: &Server, len: usize) -> Result<Duration, String> {
    let addr = ("127.0.0.1", server.port);
    let mut stream = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| format!("connecting: {e}"))?;
    stream.set_nodelay(true).map_err(|e| e.to_string())?;
    // The crate's decoder type is its `combine` dependency's, named here by inference only.
    let mut decoder = Default::default();
    let start = Instant::now();
    stream
        .write_all(REQUEST)
        .await
        .map_err(|e| format!("writing: {e}"))?;
    let value = redis::parse_redis_value_async(&mut decoder, &mut stream)
        .await
        .map_err(|e| format!("redis crate: {e}"))?;
    let took = start.elapsed();
    let got = match &value {
        redis::Value::Array(items) => items.len(),
        redis::Value::BulkString(bytes) => bytes.len(),
        other => return Err(format!("redis crate: read {other:?}")),
    };
    check(got, len)?;
    Ok(took)
}

/// A parsed reply's size (elements, or bytes) against the reply's: a sanity check that
/// the whole reply was read.
fn check(got: usize, len: usize) -> Result<(), String> {
    if got == 0 || got > len {
        return Err(format!("read a reply of {got} of {len} bytes"));
    }
    Ok(())
}

/// A loopback server answering each connection's request with `reply`, in `PIECE`-byte writes.
struct Server {
    port: u16,
}

impl Server {
    fn start(reply: Arc<Vec<u8>>) -> Result<Server, String> {
        let listener = TcpListener::bind("127.0.0.1:0").map_err(|e| format!("binding: {e}"))?;
        let port = listener.local_addr().map_err(|e| e.to_string())?.port();
        thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                if let Err(err) = answer(stream, &reply) {
                    eprintln!("server: {err}");
                }
            }
        });
        Ok(Server { port })
    }

    fn addr(&self) -> Addr {
        Addr::Tcp {
            host: "127.0.0.1".to_owned(),
            port: self.port,
        }
    }
}

fn answer(mut stream: TcpStream, reply: &[u8]) -> std::io::Result<()> {
    stream.set_nodelay(true)?;
    let mut request = [0u8; 64];
    let mut read = 0;
    while read < REQUEST.len() {
        match stream.read(&mut request[read..])? {
            0 => return Ok(()),
            n => read += n,
        }
    }
    for piece in reply.chunks(PIECE) {
        stream.write_all(piece)?;
    }
    // Closing before the client has read all would reset the connection under it: wait for
    // the client to close first.
    while stream.read(&mut request)? > 0 {}
    Ok(())
}
