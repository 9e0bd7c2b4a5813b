//! `sd_notify` for systemd units: when `NOTIFY_SOCKET` is set, the unit's status line says
//! whether the job waits for the lock (and for whom) or holds it, and `READY=1` goes out once
//! the command has started (what a `Type=notify` unit with `NotifyAccess=main` waits for).

use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::sync::OnceLock;

/// The service manager's socket, if any, looked up once.
fn socket() -> Option<&'static (UnixDatagram, SocketAddr)> {
    static SOCKET: OnceLock<Option<(UnixDatagram, SocketAddr)>> = OnceLock::new();
    SOCKET
        .get_or_init(|| {
            let path = std::env::var_os("NOTIFY_SOCKET")?;
            let bytes = std::os::unix::ffi::OsStrExt::as_bytes(path.as_os_str());
            let addr = match bytes.strip_prefix(b"@") {
                // An abstract socket (systemd's usual choice).
                Some(name) => <SocketAddr as SocketAddrExt>::from_abstract_name(name).ok()?,
                None => SocketAddr::from_pathname(&path).ok()?,
            };
            // Never wait for the service manager: the lease clock runs on this thread.
            let socket = UnixDatagram::unbound().ok()?;
            socket.set_nonblocking(true).ok()?;
            Some((socket, addr))
        })
        .as_ref()
}

/// Sends one notification (`KEY=value` lines); nothing when not run by a service manager.
/// A failure to notify never fails the job: it is logged at debug level only.
pub fn send(message: &str) {
    if let Some((socket, addr)) = socket() {
        if let Err(e) = socket.send_to_addr(message.as_bytes(), addr) {
            tracing::debug!("sd_notify failed: {e}");
        }
    }
}
