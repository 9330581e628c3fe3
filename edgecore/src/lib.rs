//! edgecore: the edge side of kubeedge-rs.

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
