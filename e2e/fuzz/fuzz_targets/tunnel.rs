#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| kubeedge_shared::fuzz_targets::tunnel(data));
