//! End-to-end harness for kubeedge-rs: fixtures, local control plane, runtime, benchmarks.

pub mod channel;
