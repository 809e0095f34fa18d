//! Integration tests: real `tessera` processes on 127.0.0.1. One test binary for the crate.

mod bad_input;
mod buckets;
mod decommission;
mod durability;
mod failed_writes;
mod faults;
mod gather;
mod harness;
mod node_tls;
mod objects;
mod ordering;
mod pools;
mod protocol;
mod query;
mod repair;
mod scrub;
mod select;
mod status;
mod tls;
mod topology;
