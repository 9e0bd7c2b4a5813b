//! The EXIT STATUS and EXAMPLES of the subcommands' man pages, for as long as their `--help`
//! does not carry them itself.
//!
//! The top page's come from `locked-run --help` (src/cli). A subcommand whose long help gains
//! an "Exit status" paragraph or an "Examples:" block of its own is rendered from that, and
//! `cargo xtask dist` then says which text here has become unused, so that each section has
//! one source. The statuses are those of src/exit.rs; docs/guide.md explains each.

/// What a page needs and its `--help` may lack.
pub struct Supplement {
    pub exit_status: &'static str,
    pub examples: &'static str,
}

/// The supplement for the subcommand of this name, if there is one.
pub fn supplement(subcommand: &str) -> Option<Supplement> {
    Some(match subcommand {
        "run" => Supplement {
            exit_status: "Exit status: the command's own; 128+N if it was ended by signal N \
(also: a signal ended the wait, nothing ran); 75 not acquired (busy with --no-wait, or --wait \
ran out; -E renumbers it); 76 the lease was lost and the command stopped or never started (--lost-exit-code); \
124 --max-run ran out; 69 the server unreachable or refusing before the command started; 2 \
usage error; 126/127 command not executable/not found.",
            examples:
                "  # a lock whose NAME is a subcommand's name (run, status, release, doctor, help)
  locked-run run status -- ./publish-status-page

  # the explicit form of the default, in a script that must not depend on NAME
  locked-run run -w 10m \"$job\" -- ./run-job",
        },
        "status" => Supplement {
            exit_status: "Exit status: 0 the lock is held; 1 it is free; 69 the server \
could not be reached or refused (with Redlock: fewer than a quorum of the servers answered); \
2 usage error (a bad NAME, URL or option).",
            examples: "  # who holds it, since when, its fence, the time left and how many wait
  locked-run status nightly-report

  # in a script: is it held? (0 held, 1 free)
  if locked-run status -q nightly-report >/dev/null; then echo busy; fi

  # one JSON object: name, held, fence, ttl_ms, holder, holders, limit, mode, waiters
  locked-run status --json nightly-report

  # a lock on this host only
  locked-run -u file:///var/lib/locked-run status rotate-logs",
        },
        "release" => Supplement {
            exit_status: "Exit status: 0 the lock was held and is released (stdout says by \
whom it was held); 1 it was free, nothing to release; 2 held and --force not given (the \
holder is named on stderr), or, with file://, held by a live process even with --force, or \
usage error; 69 the server could not be reached or refused.",
            examples: "  # who holds it; releases nothing (status 2)
  locked-run release nightly-report

  # release a stuck lock; its holder stops its command at its next renewal (76)
  locked-run release --force nightly-report

  # of several holders (--holders N, --shared), free only the one with this token
  locked-run release --force --token 5863c135-81ad-4670-95b0-728386a711fa queue-drain",
        },
        "doctor" => Supplement {
            exit_status: "Exit status: 0 no check failed (warnings included); 1 a check \
failed (a FAIL line says which, and why; an unreachable server is a FAIL); 2 usage error.",
            examples:
                "  # is this Redis fit for locks? (memory policy, persistence, role, ACL, clock)
  locked-run doctor -u redis://redis-1.internal

  # every hop of a TLS Sentinel setup, named, with the permissions on NAME's keys
  locked-run doctor --tls-ca-cert /etc/locked-run/ca.pem --name nightly

  # an etcd cluster, or a lock directory on this host
  locked-run doctor -u etcd://etcd-1:2379,etcd-2:2379,etcd-3:2379
  locked-run doctor -u file:///var/lib/locked-run --json",
        },
        _ => return None,
    })
}
