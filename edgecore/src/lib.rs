
pub mod cri;
