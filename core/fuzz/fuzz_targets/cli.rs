//! See `nvlinkd_core::fuzz::cli`.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| nvlinkd_core::fuzz::cli(data));
