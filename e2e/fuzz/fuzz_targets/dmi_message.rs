#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| kubeedge_dmi::fuzz_targets::dmi_message(data));
