//! DNS at the edge (being written).
