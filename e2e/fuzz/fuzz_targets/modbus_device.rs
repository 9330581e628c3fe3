#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| modbus_mapper::fuzz_targets::modbus_device(data));
