//! Integration tests: the real binary against real redis-server processes started on free
//! ports, real children, real signals. One target, so the suite links once.

mod support;

mod cluster;
mod command_line;
mod doctor;
mod durability;
mod errors;
mod etcd;
mod etcd_modes;
mod fair;
mod faq;
mod fencing;
mod first_contact;
mod holders;
mod hostile_servers;
mod job_session;
mod lease_loss;
mod library;
mod local;
mod local_files;
mod local_trust;
mod max_run;
mod messages;
mod postgres;
mod postgres_faults;
mod postgres_hostile;
mod postgres_modes;
mod redlock;
mod release;
mod replicas_and_sentinel;
mod running;
mod second_review;
mod secrets_and_tls;
mod secured;
mod shared;
mod shared_file;
mod shared_file_order;
mod signals;
mod status;
mod systemd_and_logs;
mod terminal;
mod upgrade;
mod waiting;
mod wakeups;
mod watcher;
