//! cloudcore: the cloud side of kubeedge-rs.
//!
//! # Public API
//!
//! The binary (`src/main.rs`), the e2e tests and the benchmarks use this crate through these
//! modules; the rest is crate-private.
//!
//! * Running cloudcore: [`app::run`] (every enabled module from a [`config::CloudCoreConfig`]),
//!   [`app::run_iptables_manager`], [`leader`] (leader election between replicas), [`http`]
//!   (`/metrics`, `/healthz`, `/readyz`), [`metrics`] and [`apiserver_requests`] (what it
//!   counts, with bounded labels).
//! * The edge channel: [`cloudhub`] (the WebSocket server, per-node queues, the `HubSink`
//!   the controllers send through), [`join`] (tokens, CSRs, certificates).
//! * The controllers: [`controller`] (downstream and upstream of pods, nodes, configmaps,
//!   secrets, services; objectsync; devices; the MetaServers' backend and RBAC policy; node
//!   leases; the one vocabulary of API-server kinds, `controller::kind`).
//! * Streams and routes: [`cloudstream`] (logs, exec, port-forward, metrics and the tunnel to
//!   edges; its certificate), [`router`] (`rules.kubeedge.io` and its endpoints).
//! * `fuzz_targets` (hidden): the decoders the fuzzer drives.

pub mod apiserver_requests;
pub mod app;
pub(crate) mod certs;
pub mod cloudhub;
pub mod cloudstream;
pub mod config;
pub mod controller;
#[doc(hidden)]
pub mod fuzz_targets;
pub mod http;
pub mod join;
pub mod leader;
pub mod metrics;
pub mod router;
