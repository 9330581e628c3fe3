#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| edgecore::fuzz_targets::dmi_report(data));
