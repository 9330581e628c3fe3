//! cloudcore: the cloud side of kubeedge-rs.

pub mod cloudhub;
pub mod metrics;
