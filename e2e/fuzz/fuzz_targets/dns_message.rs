#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| kubeedge_edgemesh::fuzz_targets::dns_message(data));
