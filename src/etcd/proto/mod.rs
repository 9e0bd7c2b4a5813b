//! The messages of etcd's gRPC API, as prost generates them from etcd's own protos (kept as
//! etcd publishes them, under `etcd/` here): `cargo xtask proto` writes the three files below,
//! and its test fails when they are stale. Generated code: not edited, not linted.

#![allow(clippy::all, clippy::pedantic, missing_docs, dead_code)]

pub mod authpb {
    include!("authpb.rs");
}
pub mod etcdserverpb {
    include!("etcdserverpb.rs");
}
pub mod mvccpb {
    include!("mvccpb.rs");
}
