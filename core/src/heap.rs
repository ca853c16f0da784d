//! Keeping the heap warm: glibc's malloc set up to keep what it frees, and
//! memory touched ahead of the links that will need it.
//!
//! A link makes the daemon allocate megabytes: the input files it reads, the
//! fatbin members it decompresses, the cubin it gets back from its worker and
//! finalizes, the entry it stores. On a daemon that has just started, every
//! one of those pages is new: the kernel zeroes it and maps it on its first
//! write, one fault per 4 KiB page. In a burst of links on a fresh daemon (a
//! build's first device links, each arch of a multi-arch build) the faults
//! were a quarter of the daemon's CPU time, and its threads queued on the
//! process's address-space lock behind each other's faults and glibc's heap
//! growth; a daemon warmed by two earlier links of other programs ran the
//! same burst about 20% faster than a fresh one. Eight nvlink processes pay the same faults, but each in
//! its own address space.
//!
//! So, before it starts any other thread, a process `configure`s malloc:
//! blocks under 32 MiB come from the heap (by default glibc gives a block
//! over 128 KiB a mapping of its own, unmapped when freed, so that every
//! output buffer faults in anew), free memory at the top of a heap is kept up
//! to a bound, and the daemon's arenas are few (one per job, at most
//! [`MAX_ARENAS`]) so that the warm memory is where its threads allocate.
//! Then `prefault` touches the reserve, `--heap-reserve` ([`DAEMON_RESERVE`]
//! by default; 0 leaves glibc's defaults alone), once in each arena and frees
//! it. The daemon holds the reserve as resident memory from its start, and
//! its links reuse it instead of faulting new pages in.
//!
//! The workers get `configure` (with glibc's arena bound: they are
//! single-threaded) but no reserve. They run nvJitLink, NVIDIA code that
//! reads out of bounds on some damaged inputs: on the damaged cubin nvlink
//! dies of SIGSEGV on, a worker with 16 MiB touched ahead read mapped memory
//! instead, and wrote an output where nvlink writes none (test `workers.rs`,
//! `crashing_input_fails_only_its_link`). The daemon runs no NVIDIA code, so
//! its heap's layout changes no link's result.

use std::sync::{mpsc, Arc, RwLock};

/// The daemon's reserve, by default.
pub const DAEMON_RESERVE: u64 = 64 << 20;

/// The daemon's most arenas: its heavy allocation happens on the `--jobs`
/// links planning and finishing at a time, and each arena gets an equal share
/// of the reserve.
pub const MAX_ARENAS: usize = 4;

/// Blocks under this come from the heap (and are reused once freed).
const MMAP_THRESHOLD: usize = 32 << 20;

/// Allocations of the warm-up: under the mmap threshold, so they are carved
/// from the arena's heap and coalesce back into it when freed.
const CHUNK: usize = 8 << 20;

/// Set glibc's malloc up: blocks under 32 MiB from the heap, up to
/// `keep_free` bytes of free memory kept at the top of each heap, and at most
/// `arenas` arenas (None: glibc's default). Call it before the process starts
/// any thread (a worker: before nvJitLink loads).
pub(crate) fn configure(arenas: Option<usize>, keep_free: usize) {
    // SAFETY: mallopt only sets allocator parameters; no other thread runs yet.
    unsafe {
        if let Some(n) = arenas {
            libc::mallopt(libc::M_ARENA_MAX, n.clamp(1, i32::MAX as usize) as libc::c_int);
        }
        libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD as libc::c_int);
        libc::mallopt(libc::M_TRIM_THRESHOLD, keep_free.min(i32::MAX as usize) as libc::c_int);
    }
}

/// The daemon's heap: `reserve` bytes over `min(jobs, MAX_ARENAS)` arenas
/// (at least one 8 MiB chunk each); 0 leaves malloc as it is.
pub fn warm_daemon(reserve: u64, jobs: usize) {
    if reserve == 0 {
        return;
    }
    let arenas = jobs.clamp(1, MAX_ARENAS);
    let share = (reserve as usize / arenas).max(CHUNK);
    configure(Some(arenas), 2 * share);
    prefault(share, arenas);
}

/// Touch `share` bytes in each of `arenas` arenas (after [`configure`]), then
/// free them: they stay in the heaps, mapped.
fn prefault(share: usize, arenas: usize) {
    // One thread per arena besides this one (which has its own), all holding
    // their memory together: a thread takes a new arena on its first
    // allocation while fewer than the maximum exist, and a thread that starts
    // after another ended would take over the ended one's arena instead.
    let gate = Arc::new(RwLock::new(()));
    let closed = gate.write().unwrap_or_else(|e| e.into_inner());
    let (touched, done) = mpsc::channel();
    let helpers: Vec<_> = (1..arenas.max(1))
        .filter_map(|i| {
            let (gate, touched) = (gate.clone(), touched.clone());
            std::thread::Builder::new()
                .name(format!("nvlinkd-heap-{i}"))
                .spawn(move || {
                    let held = touch(share);
                    let _ = touched.send(());
                    drop(gate.read());
                    drop(held);
                })
                .ok()
        })
        .collect();
    drop(touched);
    let held = touch(share);
    for _ in &helpers {
        // An error: a helper ended early (it holds nothing then).
        let _ = done.recv();
    }
    drop(closed);
    drop(held);
    for h in helpers {
        let _ = h.join();
    }
}

/// Allocate `bytes` in chunks and write each page once.
fn touch(bytes: usize) -> Vec<Vec<u8>> {
    let mut chunks: Vec<Vec<u8>> = Vec::with_capacity(bytes / CHUNK + 1);
    let mut left = bytes;
    while left > 0 {
        let n = left.min(CHUNK);
        let mut c: Vec<u8> = Vec::with_capacity(n);
        for page in c.spare_capacity_mut().chunks_mut(4096) {
            page[0].write(0);
        }
        // Keep the writes (the buffer is never read).
        std::hint::black_box(&mut c);
        chunks.push(c);
        left -= n;
    }
    chunks
}
