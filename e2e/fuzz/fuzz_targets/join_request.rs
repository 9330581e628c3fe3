#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| cloudcore::fuzz_targets::join_request(data));
