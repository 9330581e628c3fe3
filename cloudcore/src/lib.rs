//! cloudcore: the cloud side of kubeedge-rs.

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
