//! cloudcore: the cloud side of kubeedge-rs.
//!
//! # Public API
//!
//! The binary (`src/main.rs`), the e2e tests and the benchmarks use this crate through the
//! modules below and only what each of them names at its top level; every module inside them
//! is crate-private (`cargo doc -p cloudcore` shows all of it; most of its items are the
//! configuration's sections and the metrics' label sets).
//!
//! * Running cloudcore: [`app::run`] (every enabled module from a [`config::CloudCoreConfig`]),
//!   [`app::run_iptables_manager`], [`leader`] (leader election between replicas), [`http`]
//!   (`/metrics`, `/healthz`, `/readyz`), [`metrics`] and [`apiserver_requests`] (what it
//!   counts, with bounded labels).
//! * The edge channel: [`cloudhub`] ([`cloudhub::CloudHub`], the WebSocket server with its
//!   per-node queues; [`cloudhub::HubSink`], what the controllers send through), [`join`]
//!   (the token Secret, [`join::JoinServer`] and its HTTPS server for CSRs).
//! * The controllers: [`controller`] ([`controller::run_with`] starts them on a hub;
//!   [`controller::Kind`], the one vocabulary of API-server kinds; the downstream actor and
//!   its fetcher, the MetaServers' RBAC [`controller::Policy`], [`controller::SyncOptions`]
//!   of the objectsync records, [`controller::ServiceCache`]).
//! * Streams and routes: [`cloudstream`] ([`cloudstream::CloudStream`]: logs, exec,
//!   port-forward, metrics and the tunnel to edges; its certificate, the client
//!   authentication, the tunnel-port ConfigMap and the iptables manager), [`router`]
//!   ([`router::Router`]: `rules.kubeedge.io` and its endpoints).
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
