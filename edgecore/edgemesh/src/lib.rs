//! edgemesh: Services at the edge for kubeedge-rs's edgecore (KubeEdge's edgemesh module).
//!
//! ```text
//! edge database (Services, EndpointSlices) ─┐
//! edged (this node's pods, live)  ──────────┴─► Catalog ──► Snapshot ─┬─► DNS server (node-local address)
//!                                                                     ├─► ClusterIP rules (iptables)
//!                                                                     └─► relay (endpoints on other nodes)
//! ```
//!
//! edgecore feeds [`MeshInput`]s; everything else is inside this crate.

pub mod catalog;
pub mod dns;
#[doc(hidden)]
pub mod fuzz_targets;
pub mod mesh;
pub mod model;
pub mod proxy;

pub use catalog::{Catalog, Snapshot};
pub use mesh::{EdgeMesh, MeshInput};
pub use model::{EndpointSlice, Key, LocalPod, Service};
