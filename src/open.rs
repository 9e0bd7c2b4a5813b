//! The one door: what the [`Endpoints`] name, opened for a lock specification (nothing is
//! connected yet) as a run's lock ([`Backend`]) or an operator's view ([`View`]), whichever
//! backend the registry says the URLs name. Every refusal (a URL no backend takes, URLs that
//! do not go together, a mode a backend cannot hold, an option it has no use for, a NAME it
//! cannot take) is made before anything is built, from the backends' declarations. The command
//! line, the library and `doctor` all come through here. Also the runtime everything runs on.

use crate::backend::{Backend, LockSpec, Opened, Opening, View};
use crate::endpoints::Endpoints;
use crate::name::LockName;
use crate::plumbing::exit::Failure;
use crate::registry;

/// The lock the endpoints name, for a run of `spec`.
pub fn open(
    endpoints: &Endpoints,
    spec: &LockSpec,
    how: &Opening,
) -> Result<Box<dyn Backend>, Failure> {
    Ok(open_store(endpoints, spec, how)?)
}

/// The lock `name` as an operator sees it (`status`, `release --force`, `doctor`), in every
/// mode its holders may use.
pub fn look(
    endpoints: &Endpoints,
    name: &LockName,
    how: &Opening,
) -> Result<Box<dyn View>, Failure> {
    Ok(open_store(
        endpoints,
        &LockSpec::exclusive(name.clone()),
        how,
    )?)
}

/// Opens what the endpoints name for `spec`, once every refusal is made.
fn open_store(
    endpoints: &Endpoints,
    spec: &LockSpec,
    how: &Opening,
) -> Result<Box<dyn Opened>, Failure> {
    // The program's name as every backend keeps it in the holder's metadata: raw, at most a
    // name's length (a file name can be 255 bytes; the library's callers may pass anything).
    let command = crate::text::cut(how.command, crate::text::MAX_NAME);
    let how = Opening {
        command: &command,
        ..*how
    };
    let store = registry::store(endpoints, &how).map_err(Failure::usage)?;
    if let Some(why) = registry::refuses(&store, spec) {
        return Err(Failure::usage(why));
    }
    (store.backend.open)(&store, spec)
}

/// A single-threaded runtime: the child is forked from the main thread, which PDEATHSIG needs.
pub fn runtime() -> Result<tokio::runtime::Runtime, Failure> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Failure::unavailable(format!("cannot start the runtime: {e}")))
}
