//! The one integration-test binary of the e2e crate.

mod channel;
mod containerd_smoke;
mod controllers;
