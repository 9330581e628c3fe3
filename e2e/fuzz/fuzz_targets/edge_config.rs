#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| edgecore::fuzz_targets::edge_config(data));
