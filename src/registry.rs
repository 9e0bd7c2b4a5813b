//! The backends' registry: every backend of this build in one list, each as it declares itself
//! in its own folder ([`Declaration`]: its URL schemes and their forms, the modes it can hold,
//! its NAME rule, how it is opened). The door classifies each URL here, once, by the scheme its
//! backend declares, and refuses here what the declarations say cannot be given or held; the
//! line that refuses an unknown scheme names every form listed here, as do `--url`'s and
//! `doctor`'s help. No other file lists backends: adding one is its folder and a line below.

use crate::backend::{Can, Declaration, LockSpec, Mode, Modes, Opening, Queue, Several, Store};
use crate::endpoints::{
    Endpoint, Endpoints, Scheme, missing_slashes, printable, split, split_checked,
};
use crate::text::message;

/// Every backend of this build, in the order lists of them are said.
#[cfg(not(feature = "fake-backend"))]
pub const BACKENDS: &[&Declaration] = &[
    &crate::redis::BACKEND,
    &crate::file::BACKEND,
    &crate::etcd::BACKEND,
    &crate::postgres::BACKEND,
];

/// Every backend of this build, in the order lists of them are said; the fake one last.
#[cfg(feature = "fake-backend")]
pub const BACKENDS: &[&Declaration] = &[
    &crate::redis::BACKEND,
    &crate::file::BACKEND,
    &crate::etcd::BACKEND,
    &crate::postgres::BACKEND,
    &crate::fake::BACKEND,
];

/// Where the lock lives when no URL is given.
pub const DEFAULT_URL: &str = "redis://127.0.0.1:6379";

/// Every scheme every backend declares.
fn schemes() -> impl Iterator<Item = &'static Scheme> {
    BACKENDS.iter().flat_map(|backend| backend.schemes)
}

/// What `endpoints` name, classified once, with every refusal that concerns the URLs together
/// made (a URL of a backend that takes one URL given with others, `--tls-*` files where no URL
/// speaks TLS, the sentinels' password where no URL names sentinels). Each backend checks its
/// own URLs in full when it is opened.
pub fn store<'a>(endpoints: &'a Endpoints, how: &'a Opening<'a>) -> Result<Store<'a>, String> {
    let given = urls(endpoints)?;
    if let Some(line) = given.iter().find_map(|u| missing_slashes(u, schemes())) {
        return Err(line);
    }
    let mut urls = Vec::with_capacity(given.len());
    let mut backends = Vec::with_capacity(given.len());
    for url in given {
        let (backend, scheme) = classify(&url)?;
        urls.push(Endpoint::new(url, scheme));
        backends.push(backend);
    }
    let backend = backends[0];
    if urls.len() > 1 {
        if let Some(Several::Refused(line)) = backends
            .iter()
            .map(|b| b.several)
            .find(|s| matches!(s, Several::Refused(_)))
        {
            return Err(line.to_owned());
        }
        if let Some(other) = backends.iter().find(|b| !std::ptr::eq(**b, backend)) {
            return Err(message!(
                "URLs of {} and of {} cannot be given together: give the URLs of one",
                backend.called,
                other.called
            ));
        }
    }
    let tls_files = [
        &endpoints.tls.ca_cert,
        &endpoints.tls.cert,
        &endpoints.tls.key,
    ];
    if tls_files.iter().any(|f| f.is_some()) && !urls.iter().any(|u| u.scheme().tls) {
        if let Some(line) = backend.no_tls {
            return Err(line.to_owned());
        }
    }
    if endpoints.sentinel_password_file.is_some() && !urls.iter().any(|u| u.scheme().sentinels) {
        return Err(no_sentinels(&urls[0]));
    }
    Ok(Store {
        backend,
        urls,
        endpoints,
        how,
    })
}

/// The URLs: those given, else `LOCKED_RUN_URL`'s, else [`DEFAULT_URL`]. An error when
/// `LOCKED_RUN_URL` does not split into URLs (it never shows the pieces).
fn urls(endpoints: &Endpoints) -> Result<Vec<String>, String> {
    if !endpoints.given.is_empty() {
        return Ok(endpoints.given.clone());
    }
    match std::env::var("LOCKED_RUN_URL") {
        Ok(value) if !value.trim().is_empty() => split_checked(&value).map_err(|line| {
            // A piece that is one of our URLs short of its `//` says so, by its scheme alone:
            // the rest of it may hold a password.
            let short = split(&value).into_iter().find_map(|piece| {
                missing_slashes(&piece, schemes())?;
                piece.split_once(':').map(|(scheme, _)| scheme.to_owned())
            });
            match short {
                Some(scheme) => message!(
                    "LOCKED_RUN_URL holds a URL with no // after {scheme}: write it \
                     {scheme}://HOST... (it is not shown: it may hold a password)"
                ),
                None => line,
            }
        }),
        _ => Ok(vec![DEFAULT_URL.to_owned()]),
    }
}

/// The backend a URL names, and the scheme it is written with; the line for a URL whose scheme
/// no backend declares names every form they do.
fn classify(url: &str) -> Result<(&'static Declaration, &'static Scheme), String> {
    for backend in BACKENDS {
        if let Some(scheme) = backend.schemes.iter().find(|s| s.starts(url)) {
            return Ok((backend, scheme));
        }
    }
    Err(match url.split_once("://") {
        Some((scheme, _)) => message!(
            "unknown URL scheme {scheme:?} in {}: use {}",
            printable(url),
            url_forms()
        ),
        None => message!(
            "{} is not a URL (no scheme://): use {}",
            printable(url),
            url_forms()
        ),
    })
}

/// The line for `--sentinel-password-file` given where no URL names sentinels.
fn no_sentinels(first: &Endpoint) -> String {
    let sentinels: Vec<String> = schemes()
        .filter(|s| s.sentinels)
        .map(|s| format!("{}://", s.name))
        .collect();
    let given = match BACKENDS
        .iter()
        .any(|b| b.schemes.contains(first.scheme()) && b.schemes.iter().any(|s| s.sentinels))
    {
        true => "none is given".to_owned(),
        false => {
            let name = first.scheme().name;
            let article = match name.starts_with(['a', 'e', 'i', 'o', 'u']) {
                true => "an",
                false => "a",
            };
            format!("{article} {name}:// URL is given")
        }
    };
    message!(
        "--sentinel-password-file is for {} URLs, and {given}",
        sentinels.join(" and ")
    )
}

/// Every URL form the backends declare, as the line that refuses an unknown scheme lists them.
pub fn url_forms() -> String {
    let forms: Vec<&str> = schemes()
        .map(|s| s.form)
        .filter(|f| !f.is_empty())
        .collect();
    listed(&forms, ", ", " or ")
}

/// What the store cannot hold of `spec` and the opening (a mode, `--wait-replicas`, the NAME),
/// in one line: a usage error (2), said before anything is built.
pub fn refuses(store: &Store, spec: &LockSpec) -> Option<String> {
    let modes = store.modes();
    if let (Mode::Holders(_), Can::No(why)) = (spec.mode, modes.holders) {
        return Some(message!("--holders is for {}: {why}", able(|m| m.holders)));
    }
    if let (Mode::Shared, Can::No(why)) = (spec.mode, modes.shared) {
        return Some(message!("--shared is for {}: {why}", able(|m| m.shared)));
    }
    if let (Some(_), Can::No(why)) = (store.how.wait_replicas, modes.wait_replicas) {
        return Some(message!(
            "--wait-replicas is for {}: {why}",
            able(|m| m.wait_replicas)
        ));
    }
    if !spec.fair && modes.queue == Queue::Always {
        tracing::info!(
            "--no-fair changes nothing on {}: its waiters are always served in arrival order",
            store.backend.called
        );
    }
    (store.backend.name_rule)(&spec.name).err()
}

/// The backends (and several URLs of one, held together) that can hold a mode, as a list says.
fn able(can: impl Fn(&Modes) -> Can) -> String {
    let mut called = Vec::new();
    for backend in BACKENDS {
        if can(&backend.modes) == Can::Yes {
            called.push(backend.called);
        }
        if let Several::Together {
            called: they,
            modes,
        } = backend.several
        {
            if can(&modes) == Can::Yes {
                called.push(they);
            }
        }
    }
    listed(&called, ", ", " or ")
}

/// `--url`'s help: every backend's forms, and where passwords go.
pub fn url_help() -> String {
    let each: Vec<&str> = BACKENDS.iter().map(|b| b.help).collect();
    format!(
        "Server URL: {} [env: LOCKED_RUN_URL] [default: {DEFAULT_URL}]. Give passwords through \
         LOCKED_RUN_URL, --password-file or REDISCLI_AUTH (PGPASSWORD or ~/.pgpass for \
         PostgreSQL), not on the command line, which `ps` shows.",
        listed(&each, "; ", "; or ")
    )
}

/// `doctor`'s help: what it checks of each backend.
pub fn doctor_help() -> String {
    let each: Vec<&str> = BACKENDS.iter().map(|b| b.doctor).collect();
    format!(
        "Check the setup the URLs name: {}; exit 1 when a check FAILs",
        listed(&each, ", ", ", or ")
    )
}

/// `items` as a sentence lists them: `a, b, c or d`, each but the last after `sep`, the last
/// after `last`.
fn listed(items: &[&str], sep: &str, last: &str) -> String {
    match items {
        [] => String::new(),
        [one] => (*one).to_owned(),
        [rest @ .., end] => format!("{}{last}{end}", rest.join(sep)),
    }
}

#[cfg(test)]
mod tests;
