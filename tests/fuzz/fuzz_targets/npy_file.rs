#![no_main]
// Thin wrapper: the body is meshfeed_fuzz::npy_file (src/lib.rs), shared with tests/replay.rs.
libfuzzer_sys::fuzz_target!(|data: &[u8]| meshfeed_fuzz::npy_file(data));
