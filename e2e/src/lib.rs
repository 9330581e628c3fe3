//! End-to-end harness for kubeedge-rs: fixtures, local control plane, runtime, benchmarks.

pub mod apiserver;
pub mod channel;
pub mod cloud;
pub mod cluster;
pub mod containerd;
pub mod edge;
pub mod images;
pub mod node_address;
pub mod process;
pub mod procfs;
pub mod registry;
pub mod reliablesyncs;
pub mod sim_edge;
pub mod stream_client;
