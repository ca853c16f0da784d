//! Every input that ever crashed a fuzz target (`core/fuzz`), replayed on every
//! target. Files live in `tests/fuzz-regressions/<target>/`; each crash found
//! is added there when it is fixed.

use std::path::Path;

#[test]
fn replay_fuzz_crashes() {
    // Like the fuzzer's RSS limit: an input must not make us reserve gigabytes.
    let limit = libc::rlimit { rlim_cur: 3 << 30, rlim_max: 3 << 30 };
    // SAFETY: setrlimit with a valid struct; this test binary runs only this test.
    unsafe { libc::setrlimit(libc::RLIMIT_AS, &limit) };
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fuzz-regressions");
    let mut n = 0;
    for dir in std::fs::read_dir(&root).expect("regression dir").flatten() {
        for file in std::fs::read_dir(dir.path()).expect("target dir").flatten() {
            let data = std::fs::read(file.path()).expect("read");
            nvlinkd_core::fuzz::cli(&data);
            nvlinkd_core::fuzz::elf(&data);
            nvlinkd_core::fuzz::fatbin(&data);
            nvlinkd_core::fuzz::archive(&data);
            nvlinkd_core::fuzz::inputs(&data);
            n += 1;
        }
    }
    assert!(n > 0, "no regression inputs found");
}
