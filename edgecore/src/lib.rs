//! edgecore: the edge side of kubeedge-rs.
//!
//! # Public API
//!
//! The binary (`src/main.rs`), the e2e tests and the benchmarks use this crate through the
//! modules below and only what each of them names at its top level; every module inside them
//! is crate-private (`cargo doc -p edgecore` shows all of it; half of its items are the
//! configuration's sections). edged itself is the library crate
//! `kubeedge-edged` (pods over CRI), which this crate runs.
//!
//! * Running an edge: [`app::EdgeCore`] (start every enabled module from an
//!   [`config::EdgeCoreConfig`], or with a given `EdgedConfig`, and stop them),
//!   [`edged_config::edged_config`] (`modules.edged` → the edged library's settings),
//!   [`install`] (`edgecore join`/`install`/`reset`), [`memory`] (giving start-up code and
//!   freed heap back).
//! * The link to the cloud: [`edgehub::EdgeHub`] (dial, send, request/reply, link events,
//!   [`edgehub::Routes`]: which module takes which group), [`certmanager`] (the node
//!   certificate from a join token, its rotation, `edgecore join`).
//! * Storage and the modules around it: [`metamanager`] (the SQLite store
//!   [`metamanager::MetaStore`] and [`metamanager::MetaManager`], serving edged's
//!   `MetaService`), [`metaserver`] (the local Kubernetes API), [`eventbus`] (MQTT),
//!   [`taskmanager`] (node jobs: the upgrade and configuration-update markers a restart
//!   reads), [`edgestream`] (logs, exec, metrics and the tunnel; its TLS and relay dialer for
//!   tests), [`mesh`] (Services at the edge, around `kubeedge-edgemesh`).
//! * `fuzz_targets` (hidden): the decoders the fuzzer drives.

pub mod app;
pub mod certmanager;
pub mod config;
pub(crate) mod devicetwin;
pub mod edged_config;
pub mod edgehub;
pub mod edgestream;
pub mod eventbus;
#[doc(hidden)]
pub mod fuzz_targets;
pub mod install;
pub mod memory;
pub mod mesh;
pub mod metamanager;
pub mod metaserver;
pub(crate) mod module_metrics;
pub(crate) mod servicebus;
pub mod taskmanager;
pub(crate) mod tls_files;
