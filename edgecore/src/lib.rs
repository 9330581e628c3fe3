//! edgecore: the edge side of kubeedge-rs.

pub mod cri;
pub mod edgehub;
pub mod metamanager;
