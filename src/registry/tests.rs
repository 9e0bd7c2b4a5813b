//! The registry against what each backend declares: every scheme classified to its backend,
//! the lines said from the declarations (pinned where the line is older than the registry), and
//! the refusals of the URLs together.

use std::time::Duration;

use super::*;
use crate::name::LockName;

/// What `status` opens with.
fn looking() -> Opening<'static> {
    Opening {
        command: "status",
        node_timeout: Duration::from_secs(1),
        wait_replicas: None,
        lenient: false,
    }
}

/// The backend and the scheme `url` is classified to.
fn class(url: &str) -> (&'static str, &'static str, bool) {
    let (backend, scheme) = classify(url).unwrap();
    (backend.called, scheme.name, scheme.tls)
}

#[test]
fn every_scheme_names_its_backend() {
    let redis = super::BACKENDS[0].called;
    for (url, called, scheme, tls) in [
        ("redis://h", redis, "redis", false),
        ("rediss://h", redis, "rediss", true),
        ("redis+unix:///run/redis.sock", redis, "redis+unix", false),
        ("redis+sentinel://h/m", redis, "redis+sentinel", false),
        ("rediss+sentinel://h/m", redis, "rediss+sentinel", true),
        ("REDISS+CLUSTER://h", redis, "rediss+cluster", true),
        ("etcd://h", "etcd://", "etcd", false),
        ("etcds://h", "etcd://", "etcds", true),
        ("file:///var/lib/locks", "file://", "file", false),
        ("FILE:///x", "file://", "file", false),
        ("file:/var/lib/locks", "file://", "file", false),
        ("postgres://u@h/db", "postgres://", "postgres", false),
        ("postgresql://h", "postgres://", "postgresql", false),
    ] {
        assert_eq!(class(url), (called, scheme, tls), "{url}");
    }
}

/// See issue 44: `-u postgress://db/locks` was answered with every URL form but postgres's,
/// from a list of its own that no backend's declaration kept.
#[test]
fn an_unknown_scheme_is_answered_with_every_declared_form() {
    let line = classify("postgress://db/locks").unwrap_err();
    assert!(
        line.starts_with("unknown URL scheme \"postgress\" in postgress://db/locks: use "),
        "{line}"
    );
    for scheme in schemes().filter(|s| !s.form.is_empty()) {
        assert!(line.contains(scheme.form), "{line} lacks {}", scheme.form);
    }
    let line = classify("app:pw@redis.internal:6379").unwrap_err();
    assert!(
        line.starts_with("(a URL with credentials, not shown) is not a URL (no scheme://): use "),
        "{line}"
    );
}

/// The lines that predate the registry read as they did, now made from the declarations.
#[cfg(not(feature = "fake-backend"))]
#[test]
fn the_lines_made_of_declarations_read_as_before() {
    assert_eq!(
        url_forms(),
        "redis://[user@]host[:port][/db], rediss:// (TLS), redis+unix:///path, \
         redis+sentinel://host:port[,...]/MASTER, rediss+sentinel://, \
         redis+cluster://host:port[,...], rediss+cluster://, file:///DIR (this host only), \
         etcd://host:port[,...], etcds:// (TLS) or postgres://[user@]host[:port][,...]/DB"
    );
    assert_eq!(
        doctor_help(),
        "Check the setup the URLs name: Redis (reachability, role, memory policy, \
         persistence, permissions, clocks), a file:// directory, an etcd cluster, or a \
         PostgreSQL database (connection, TLS, primary, tables, privileges, \
         synchronous_commit); exit 1 when a check FAILs"
    );
    let how = looking();
    let endpoints = Endpoints::new(["redis://a:1", "redis://b:2", "redis://c:3"]);
    let redlock = store(&endpoints, &how).unwrap();
    let name = LockName::new("job").unwrap();
    let spec = |mode| LockSpec {
        name: name.clone(),
        mode,
        fair: true,
    };
    assert_eq!(
        refuses(&redlock, &spec(Mode::Holders(2))).unwrap(),
        "--holders is for one Redis server (plain, Sentinel, Cluster), file://, etcd:// or \
         postgres://: Redlock over several servers holds one lock at a time"
    );
    assert_eq!(
        refuses(&redlock, &spec(Mode::Shared)).unwrap(),
        "--shared is for one Redis server (plain, Sentinel, Cluster), file://, etcd:// or \
         postgres://: Redlock over several servers holds one lock at a time"
    );
    assert_eq!(refuses(&redlock, &spec(Mode::Exclusive)), None);
}

#[test]
fn wait_replicas_is_refused_where_no_replica_can_acknowledge() {
    let how = Opening {
        wait_replicas: Some((1, Duration::from_secs(1))),
        ..looking()
    };
    let name = LockName::new("job").unwrap();
    let spec = LockSpec::exclusive(name);
    for (urls, why) in [
        (
            &["redis://a:1", "redis://b:2", "redis://c:3"][..],
            "Redlock's servers are independent primaries",
        ),
        (&["file:///tmp/x"], "file:// has no server"),
        (&["etcd://h:2379"], "etcd commits every write through Raft"),
        (&["postgres://h/db"], "synchronous_commit = on"),
    ] {
        let endpoints = Endpoints::new(urls.iter().copied());
        let line = refuses(&store(&endpoints, &how).unwrap(), &spec).unwrap();
        assert!(
            line.starts_with(
                "--wait-replicas is for one Redis server (plain, Sentinel, Cluster): "
            ),
            "{line}"
        );
        assert!(line.contains(why), "{line}");
    }
    let one = Endpoints::new(["redis://a:1"]);
    assert_eq!(refuses(&store(&one, &how).unwrap(), &spec), None);
}

#[test]
fn urls_of_a_backend_that_takes_one_are_refused_with_others() {
    let how = looking();
    for (urls, line) in [
        (
            &["redis://a:1", "etcd://h:2379"][..],
            "an etcd:// URL names a whole cluster",
        ),
        (
            &["postgres://h/db", "redis://a:1"],
            "a postgres:// URL names one database",
        ),
        (
            &["redis://a:1", "file:///tmp/x"],
            "file:// keeps locks on this host only",
        ),
    ] {
        let endpoints = Endpoints::new(urls.iter().copied());
        let refused = store(&endpoints, &how).err().unwrap();
        assert!(refused.starts_with(line), "{urls:?}: {refused}");
    }
}

#[test]
fn connection_options_no_url_uses_are_refused() {
    let how = looking();
    let with_tls = |url: &str| Endpoints {
        tls: crate::endpoints::TlsOptions {
            ca_cert: Some("ca.pem".into()),
            ..Default::default()
        },
        ..Endpoints::new([url])
    };
    for (url, line) in [
        ("redis://h", Some("are for rediss:// URLs")),
        ("rediss://h", None),
        ("etcd://h", Some("are for etcds:// URLs")),
        ("etcds://h", None),
        ("file:///tmp/x", Some("file:// has no server")),
        // sslmode says whether the files are used.
        ("postgres://h/db", None),
    ] {
        let refused = store(&with_tls(url), &how).err();
        match line {
            Some(line) => assert!(refused.as_deref().unwrap_or("").contains(line), "{url}"),
            None => assert_eq!(refused, None, "{url}"),
        }
    }
    let with_sentinels = |url: &str| Endpoints {
        sentinel_password_file: Some("s".into()),
        ..Endpoints::new([url])
    };
    for (url, given) in [
        ("redis://h", "none is given"),
        ("etcd://h", "an etcd:// URL is given"),
        ("postgres://h/db", "a postgres:// URL is given"),
        ("file:///tmp/x", "a file:// URL is given"),
    ] {
        assert_eq!(
            store(&with_sentinels(url), &how).err().unwrap(),
            format!(
                "--sentinel-password-file is for redis+sentinel:// and rediss+sentinel:// URLs, \
                 and {given}"
            )
        );
    }
    assert!(store(&with_sentinels("redis+sentinel://h/m"), &how).is_ok());
}

/// See issue 47: `-u redis:/127.0.0.1` was answered "has no host", which does not say
/// what is wrong with it.
#[test]
fn a_url_without_its_double_slash_is_told_so() {
    for (url, line) in [
        (
            "redis:/127.0.0.1",
            "redis:/127.0.0.1 has no // after redis: write redis://127.0.0.1",
        ),
        (
            "redis:127.0.0.1:6379/2",
            "redis:127.0.0.1:6379/2 has no // after redis: write redis://127.0.0.1:6379/2",
        ),
        (
            "postgres:/db1:5432/locks",
            "postgres:/db1:5432/locks has no // after postgres: write \
             postgres://db1:5432/locks",
        ),
        (
            "redis+unix:/run/redis.sock",
            "redis+unix:/run/redis.sock has no // after redis+unix: write \
             redis+unix:///run/redis.sock",
        ),
        (
            "etcds:/e1:2379,e2:2379",
            "etcds:/e1:2379,e2:2379 has no // after etcds: write etcds://e1:2379,e2:2379",
        ),
        // Never its password.
        (
            "redis:/app:pw@h:6379",
            "redis:/app@h:6379 has no // after redis: write redis://app@h:6379",
        ),
    ] {
        assert_eq!(
            missing_slashes(url, schemes()).as_deref(),
            Some(line),
            "{url}"
        );
    }
    for url in [
        "redis://127.0.0.1",
        "redis:///x",
        "file:/var/lib/locks",
        "http:/example.com",
        "127.0.0.1:6379",
        // A host named redis (a container's service) and its port.
        "redis:6379",
    ] {
        assert_eq!(missing_slashes(url, schemes()), None, "{url}");
    }
}
