//! A node's first write on a new connection, and Redis 6.2's wrapped script errors.

use super::refusals::script_error;
use super::*;

fn open(url: &str) -> Node {
    Node::open(url, Duration::from_secs(1), None).unwrap()
}

#[test]
fn a_new_connection_authenticates_and_selects_first() {
    let n = open("redis://127.0.0.1:6380/2");
    assert_eq!(
        n.hello(true),
        [
            vec![b"HELLO".to_vec(), b"3".to_vec()],
            vec![b"SELECT".to_vec(), b"2".to_vec()]
        ]
    );
    let n = open("redis://cron:p%40ss@[::1]");
    assert_eq!(
        n.hello(false),
        [vec![b"AUTH".to_vec(), b"cron".to_vec(), b"p@ss".to_vec()]]
    );
    assert_eq!(
        n.hello(true)[0],
        [&b"HELLO"[..], b"3", b"AUTH", b"cron", b"p@ss"]
    );
    let n = open("redis+unix:///run/redis.sock?db=3&pass=secret");
    assert_eq!(n.hello(false)[0], [b"AUTH".to_vec(), b"secret".to_vec()]);
    assert_eq!(n.hello(false)[1], [b"SELECT".to_vec(), b"3".to_vec()]);
    assert_eq!(
        n.hello(true)[0],
        [&b"HELLO"[..], b"3", b"AUTH", b"default", b"secret"]
    );
    let n = Node::open("redis://h", Duration::from_secs(1), Some("fromfile")).unwrap();
    assert_eq!(n.hello(false)[0], [b"AUTH".to_vec(), b"fromfile".to_vec()]);
}

#[test]
fn redis_6_script_errors_are_unwrapped() {
    assert_eq!(
        script_error(
            "ERR Error running script (call to f_b011): @user_script:6: @user_script: 6: \
             -READONLY You can't write against a read only replica."
        ),
        "READONLY You can't write against a read only replica."
    );
    assert_eq!(
        script_error(
            "ERR Error running script (call to f_b0): @user_script:18: WRONGTYPE Operation"
        ),
        "WRONGTYPE Operation"
    );
    assert_eq!(script_error("NOPERM this user"), "NOPERM this user");
}
