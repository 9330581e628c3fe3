//! edgecore: the edge side of kubeedge-rs.

pub mod edgehub;
