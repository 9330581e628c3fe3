//! End-to-end harness for kubeedge-rs: fixtures, local control plane, runtime, benchmarks.

/// The in-memory Kubernetes API server (its own crate, `kube-memserver`).
pub use kube_memserver as apiserver;
pub mod bench;
pub mod channel;
pub mod cloud;
pub mod cloudcore_image;
pub mod cluster;
pub mod containerd;
pub mod crds;
pub mod devices;
pub mod edge;
pub mod elf;
pub mod images;
pub mod mosquitto;
pub mod mqtt;
pub mod node_address;
pub mod pod_probe;
pub mod process;
pub mod procfs;
pub mod registry;
pub mod reliablesyncs;
pub mod router;
pub mod sim_edge;
pub mod stream_client;
pub mod wire_proxy;
