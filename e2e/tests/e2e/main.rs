//! The one integration-test binary of the e2e crate.

mod autonomy;
mod channel;
mod chaos;
mod chaos_kubeedge;
mod churn;
mod cloudcore_image;
mod containerd_smoke;
mod controllers;
mod demo_cli;
mod devices;
mod edged;
mod eventbus;
mod events;
mod image_gc;
mod join;
mod kubeedge_cloud;
mod metamanager;
mod metaserver;
mod metaserver_pods;
mod metrics;
mod objectsync;
mod portforward;
mod resilience;
mod stream;
mod stream_auth;
mod tunnel_port;
