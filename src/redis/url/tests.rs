//! URL parsing: what each scheme opens, defaults filled in, passwords noticed and never shown.

use super::*;

fn open(url: &str) -> Result<Target, String> {
    parse(url, None, None)
}

/// Whether the URL itself carries its password (not the default one).
fn url_has_password(url: &str) -> bool {
    parse(url, Some("default"), None).is_ok_and(|t| t.password_in_url)
}

fn direct(target: &Target) -> &Addr {
    match &target.topology {
        Topology::Direct { addr, .. } => addr,
        _ => panic!("not one server"),
    }
}

/// Whether the URL itself carries a password (for the warning about `ps`).
#[test]
fn passwords_in_urls_are_noticed() {
    assert!(url_has_password("redis://:pw@h"));
    assert!(url_has_password("redis+unix:///s?pass=pw"));
    assert!(!url_has_password("redis://user@h"));
    assert!(!url_has_password("not a url"));
}

#[test]
fn a_default_password_fills_in_only_where_the_url_has_none() {
    let t = parse("redis://h", Some("fromfile"), None).unwrap();
    assert_eq!(t.password.as_deref(), Some("fromfile"));
    let t = parse("redis://:inurl@h", Some("fromfile"), None).unwrap();
    assert_eq!(t.password.as_deref(), Some("inurl"));
    let t = parse("redis://cron@h", None, None).unwrap();
    assert_eq!(
        t.user, None,
        "a user without a password is the default user"
    );
}

#[test]
fn tcp_urls() {
    let t = open("redis://127.0.0.1:6380/2").unwrap();
    assert_eq!(
        direct(&t),
        &Addr::Tcp {
            host: "127.0.0.1".into(),
            port: 6380
        }
    );
    assert_eq!(t.db, 2);
    let t = open("redis://cron:p%40ss@[::1]").unwrap();
    assert_eq!(
        direct(&t),
        &Addr::Tcp {
            host: "::1".into(),
            port: 6379
        }
    );
    assert_eq!(
        (t.user.as_deref(), t.password.as_deref()),
        (Some("cron"), Some("p@ss"))
    );
    assert_eq!(t.address, "redis://cron@[::1]");
    assert!(open("redis://").err().unwrap().contains("no host"));
    assert!(
        open("redis://h/x")
            .err()
            .unwrap()
            .contains("a database is a number")
    );
}

#[test]
fn unix_urls() {
    let t = open("redis+unix:///run/redis.sock?db=3&pass=secret").unwrap();
    assert_eq!(direct(&t), &Addr::Unix("/run/redis.sock".into()));
    assert_eq!((t.password.as_deref(), t.db), (Some("secret"), 3));
    assert_eq!(t.address, "redis+unix:///run/redis.sock?db=3");
}

#[test]
fn sentinel_urls() {
    let t = open("redis+sentinel://:pw@s1:26380,s2,[::1]:26381/mymaster/2").unwrap();
    let Topology::Sentinel(s) = &t.topology else {
        panic!("not sentinels")
    };
    assert_eq!(s.master, "mymaster");
    assert_eq!(
        s.hosts,
        [
            ("s1".to_owned(), 26380),
            ("s2".to_owned(), 26379),
            ("::1".to_owned(), 26381)
        ]
    );
    assert_eq!((t.db, t.password.as_deref()), (2, Some("pw")));
    assert_eq!(
        t.address,
        "redis+sentinel://s1:26380,s2,[::1]:26381/mymaster/2"
    );
    assert!(url_has_password("redis+sentinel://:pw@s1/m"));
    assert!(!url_has_password("redis+sentinel://s1/m"));
    assert!(!url_has_password("redis+sentinel://user@s1/m"));
    assert!(open("redis+sentinel://s1").is_err());
    assert!(open("redis+sentinel://s1/").is_err());
}

/// A password with a `/` in it (not percent-encoded) is a password, not a path: it is
/// used, noticed, and never printed, in sentinel and cluster URLs alike.
#[test]
fn a_slash_in_a_password_stays_in_the_password() {
    let t = open("redis+sentinel://u:pa/ss@s1:26380/mymaster").unwrap();
    assert_eq!(
        (t.user.as_deref(), t.password.as_deref()),
        (Some("u"), Some("pa/ss"))
    );
    assert_eq!(t.address, "redis+sentinel://u@s1:26380/mymaster");
    let t = open("redis+cluster://:pa/ss@n1:7000").unwrap();
    assert_eq!(t.password.as_deref(), Some("pa/ss"));
    for url in [
        "redis+sentinel://:pa/ss@127.0.0.1:1/m",
        "redis+cluster://:pa/ss@127.0.0.1:1",
    ] {
        assert!(url_has_password(url), "{url}");
        assert!(!printable(url).contains("ss"), "{}", printable(url));
    }
    let bad = open("redis+sentinel://:pa/ss@127.0.0.1:1").err().unwrap();
    assert!(!bad.contains("ss@"), "{bad}");
}

#[test]
fn cluster_urls() {
    let t = open("redis+cluster://:pw@n1:7000,n2:7001,n3").unwrap();
    let Topology::Cluster(c) = &t.topology else {
        panic!("not a cluster")
    };
    assert_eq!(
        c.seeds(),
        [
            ("n1".to_owned(), 7000),
            ("n2".to_owned(), 7001),
            ("n3".to_owned(), 6379)
        ]
    );
    assert_eq!(t.address, "redis+cluster://n1:7000,n2:7001,n3");
    assert!(url_has_password("redis+cluster://:pw@n1"));
    assert!(
        open("redis+cluster://n1:7000/1")
            .err()
            .unwrap()
            .contains("only database 0")
    );
}

#[test]
fn other_schemes_are_refused_without_showing_passwords() {
    assert!(
        open("http://h")
            .err()
            .unwrap()
            .contains("is not a supported Redis URL")
    );
    assert!(!open("ftp://u:hunter2@h").err().unwrap().contains("hunter2"));
    assert!(open("rediss://h").is_ok(), "TLS with the system roots");
    assert!(open("not a url").is_err());
}

/// `rediss+sentinel://` and `rediss+cluster://` speak TLS at every hop; the plain schemes
/// never do. Parsed, printed and checked as their plain forms.
#[test]
fn secured_sentinel_and_cluster_urls() {
    let t = open("rediss+sentinel://locker:pw@s1:26380,s2/mymaster/1").unwrap();
    let Topology::Sentinel(s) = &t.topology else {
        panic!("not sentinels")
    };
    assert!(s.tls.is_some(), "TLS to the sentinels");
    assert_eq!(s.master, "mymaster");
    assert_eq!(s.hosts[1], ("s2".to_owned(), 26379));
    assert_eq!(
        (t.user.as_deref(), t.password.as_deref(), t.db),
        (Some("locker"), Some("pw"), 1)
    );
    assert_eq!(t.address, "rediss+sentinel://locker@s1:26380,s2/mymaster/1");
    assert!(url_has_password("rediss+sentinel://:pw@s1/m"));
    assert!(!crate::endpoints::printable("rediss+sentinel://:pw@s1/m").contains("pw"));
    assert!(
        open("rediss+sentinel://s1")
            .err()
            .unwrap()
            .contains("use rediss+sentinel://")
    );

    let t = open("rediss+cluster://:pw@n1:7000,n2").unwrap();
    let Topology::Cluster(c) = &t.topology else {
        panic!("not a cluster")
    };
    assert!(c.tls().is_some(), "TLS to every node");
    assert_eq!(c.seeds()[1], ("n2".to_owned(), 6379));
    assert_eq!(t.address, "rediss+cluster://n1:7000,n2");
    assert!(url_has_password("rediss+cluster://:pw@n1"));
    assert!(!crate::endpoints::printable("rediss+cluster://:pw@n1").contains("pw"));

    let Topology::Sentinel(s) = open("redis+sentinel://s1/m").unwrap().topology else {
        panic!("not sentinels")
    };
    assert!(s.tls.is_none(), "redis+sentinel:// stays plain");
    for (url, tls) in [
        ("rediss://h", true),
        ("rediss+sentinel://s/m", true),
        ("rediss+cluster://n", true),
        ("redis://h", false),
        ("redis+sentinel://s/m", false),
        ("redis+cluster://n", false),
    ] {
        let target = open(url).unwrap();
        let secure = match &target.topology {
            Topology::Direct { tls, .. } => tls.is_some(),
            Topology::Sentinel(s) => s.tls.is_some(),
            Topology::Cluster(c) => c.tls().is_some(),
        };
        assert_eq!(secure, tls, "{url}");
        let declared = super::super::BACKEND.schemes.iter().find(|s| s.starts(url));
        assert_eq!(declared.map(|s| s.tls), Some(tls), "{url}");
    }
}
