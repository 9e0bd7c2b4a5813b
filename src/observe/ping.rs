//! `--ping URL`: a monitor told of the run, in healthchecks.io's protocol: `GET URL/start` once
//! the lock is held and the command starts, then `GET URL` when the run ends 0, `GET URL/N` when
//! it ends N (a lost lock: `URL/76`); nothing for a run that skipped (75: another host has the
//! job), so that a monitor alerts only when no host ran it. Each ping carries `rid=` and the
//! run's token, so that overlapping runs pair up; a query string in URL stays after the path.
//!
//! Pings go out from a thread of their own, name resolution included: never on the lease
//! clock's path, never before the command's start, never before the release. They go out in
//! order (the end's after the start's was answered or given up), each within a few seconds and
//! retried once; one that fails is one warning and changes no status.

use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

use http_body_util::Empty;
use hyper::body::Bytes;
use hyper::client::conn::http1;
use hyper::{Request, Uri};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use crate::endpoints::{TlsOptions, connector};

/// How long one ping may take, from name resolution to the answer's status line.
const TIMEOUT: Duration = Duration::from_secs(3);

enum Ping {
    Start { rid: String },
    End { status: u8, rid: String },
}

/// The monitor's pinger: a thread that sends what it is given, in order.
pub struct Pinger {
    pings: Option<mpsc::Sender<Ping>>,
    thread: Option<JoinHandle<()>>,
}

impl Pinger {
    /// Checks `url` (http:// or https://, no fragment) and starts the thread; nothing is sent
    /// yet.
    pub fn new(url: &str) -> Result<Pinger, String> {
        let base = url::Url::parse(url)
            .map_err(|e| crate::text::message!("--ping {url} is not a URL ({e})"))?;
        if !matches!(base.scheme(), "http" | "https") || base.host_str().is_none() {
            return Err(crate::text::message!(
                "--ping {url} is not an http:// or https:// URL: give a healthchecks.io check's \
                 ping URL"
            ));
        }
        let (pings, inbox) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("locked-run-ping".into())
            .spawn(move || send_all(&base, &inbox))
            .map_err(|e| crate::text::message!("cannot start the --ping thread: {e}"))?;
        Ok(Pinger {
            pings: Some(pings),
            thread: Some(thread),
        })
    }

    /// The command starts (does not wait).
    pub fn start(&self, rid: &str) {
        if let Some(pings) = &self.pings {
            let _ = pings.send(Ping::Start { rid: rid.into() });
        }
    }

    /// The run ended with `status`: the end's ping, then waits for the thread, which has at
    /// most the start's ping and this one to send, each within its timeout and one retry.
    pub fn end(mut self, status: u8, rid: &str) {
        if let Some(pings) = self.pings.take() {
            let _ = pings.send(Ping::End {
                status,
                rid: rid.into(),
            });
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for Pinger {
    /// A run that ends without an end's ping (it skipped): the thread sends what it was given
    /// and is waited for.
    fn drop(&mut self) {
        drop(self.pings.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The thread: each ping in order, until the run's end.
fn send_all(base: &url::Url, inbox: &mpsc::Receiver<Ping>) {
    let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    else {
        tracing::warn!("cannot start the --ping thread: its runtime failed; no ping is sent");
        return;
    };
    for ping in inbox {
        let url = match &ping {
            Ping::Start { rid } => target(base, "start", rid),
            Ping::End { status: 0, rid } => target(base, "", rid),
            Ping::End { status, rid } => target(base, &status.to_string(), rid),
        };
        let mut result = runtime.block_on(get(&url));
        if result.is_err() {
            result = runtime.block_on(get(&url));
        }
        if let Err(e) = result {
            tracing::warn!("the monitor was not pinged ({}): {e}", shown(&url));
        }
    }
}

/// `base` with `/suffix` after its path (none for an empty suffix) and `rid=` in its query.
pub fn target(base: &url::Url, suffix: &str, rid: &str) -> url::Url {
    let mut url = base.clone();
    if !suffix.is_empty() {
        let path = url.path().trim_end_matches('/').to_owned();
        url.set_path(&format!("{path}/{suffix}"));
    }
    url.query_pairs_mut().append_pair("rid", rid);
    url
}

/// A ping URL as a line may show it: ping URLs are secrets of a kind (whoever has one can
/// report the job's runs), so only the host is shown.
fn shown(url: &url::Url) -> String {
    format!("{}://{}/...", url.scheme(), url.host_str().unwrap_or("?"))
}

/// One GET, its answer's status a success, within [`TIMEOUT`].
async fn get(url: &url::Url) -> Result<(), String> {
    match tokio::time::timeout(TIMEOUT, exchange(url)).await {
        Ok(result) => result,
        Err(_) => {
            let late = format!("no answer within {}", crate::text::show(TIMEOUT));
            Err(late)
        }
    }
}

async fn exchange(url: &url::Url) -> Result<(), String> {
    let host = url.host_str().ok_or("no host")?.to_owned();
    let port = url.port_or_known_default().ok_or("no port")?;
    let stream = TcpStream::connect((host.as_str(), port))
        .await
        .map_err(|e| format!("cannot connect: {e}"))?;
    // The origin form (path and query), as a client speaks to the server itself.
    let target = match url.query() {
        Some(query) => format!("{}?{query}", url.path()),
        None => url.path().to_owned(),
    };
    let request = Request::get(target.parse::<Uri>().map_err(|e| e.to_string())?)
        .header(hyper::header::HOST, host.as_str())
        .header(
            hyper::header::USER_AGENT,
            concat!("locked-run/", env!("CARGO_PKG_VERSION")),
        )
        .body(Empty::<Bytes>::new())
        .map_err(|e| e.to_string())?;
    let status = match url.scheme() {
        "https" => {
            let tls = connector(&TlsOptions::default())?;
            let name =
                rustls_pki_types::ServerName::try_from(host.clone()).map_err(|e| e.to_string())?;
            let stream = tls.connect(name, stream).await.map_err(|e| e.to_string())?;
            send(stream, request).await?
        }
        _ => send(stream, request).await?,
    };
    if status.is_success() {
        return Ok(());
    }
    let refused = format!("it answered {status}");
    Err(refused)
}

/// The request on a fresh HTTP/1.1 connection; only the status is read, never the body.
async fn send<T>(io: T, request: Request<Empty<Bytes>>) -> Result<hyper::StatusCode, String>
where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, connection) = http1::handshake(TokioIo::new(io))
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    let answer = sender
        .send_request(request)
        .await
        .map_err(|e| e.to_string())?;
    Ok(answer.status())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ping_goes_after_the_path_and_keeps_the_query() {
        let base = url::Url::parse("https://hc-ping.com/abc-123?create=1").unwrap();
        assert_eq!(
            target(&base, "start", "t-1").as_str(),
            "https://hc-ping.com/abc-123/start?create=1&rid=t-1"
        );
        assert_eq!(
            target(&base, "", "t-1").as_str(),
            "https://hc-ping.com/abc-123?create=1&rid=t-1"
        );
        let bare = url::Url::parse("http://127.0.0.1:8000/ping/k/").unwrap();
        assert_eq!(
            target(&bare, "76", "t").as_str(),
            "http://127.0.0.1:8000/ping/k/76?rid=t"
        );
    }
}
