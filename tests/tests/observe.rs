//! The core's typed events (`nvlinkd_core::observe`), seen by an observer of a
//! linker used as a library: no daemon, no event stream, no log. Each phase a
//! link runs is reported once, when it ends, with the link's id, whichever
//! thread ran it (PTX modules compile on the rayon pool, nvJitLink and NVVM in
//! worker processes).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use nvlinkd_core::fs::LocalFs;
use nvlinkd_core::observe::{LinkEvent, Observer, Phase};
use nvlinkd_core::request::{EngineKind, Request};
use nvlinkd_core::worker::Cancel;
use nvlinkd_core::{Linker, LinkerConfig};
use nvlinkd_tests::corpus;
use nvlinkd_tests::env::{cuda_home, nvlinkd, TempDir};
use nvlinkd_tests::run::Invocation;

#[derive(Default)]
struct Recorder(Mutex<Vec<LinkEvent>>);

impl Observer for Recorder {
    fn event(&self, e: &LinkEvent) {
        self.0.lock().unwrap().push(e.clone());
    }
}

impl Recorder {
    fn take(&self) -> Vec<LinkEvent> {
        std::mem::take(&mut *self.0.lock().unwrap())
    }
}

/// Link `args` (templated as the parity cases are) as link `id`; its events.
fn link(linker: &Linker, rec: &Recorder, args: &str, out: &TempDir) -> (u64, EngineKind, Vec<LinkEvent>) {
    let inv = Invocation::templated(args, corpus::dir(), out);
    let req = Request::local(inv.args, inv.cwd);
    let (id, span) = linker.link_span_with_id(&req);
    let _in_link = span.enter();
    let outcome = linker.link_cancellable(id, &req, &LocalFs, &Cancel::new());
    assert_eq!(outcome.exit_code, 0, "{args}: {}", String::from_utf8_lossy(&outcome.stderr));
    (id, outcome.engine, rec.take())
}

/// The phases among `events`, each with how often it ended and whether it was
/// cached (every time); every event must be about link `id`.
fn phases(id: u64, events: &[LinkEvent]) -> BTreeMap<&'static str, (usize, bool)> {
    let mut seen = BTreeMap::new();
    for e in events {
        assert_eq!(e.link(), id, "an event of another link: {e:?}");
        if let LinkEvent::PhaseFinished { phase, cached, ms, .. } = e {
            assert!(*ms >= 0.0, "{e:?}");
            let entry = seen.entry(phase.name()).or_insert((0, true));
            *entry = (entry.0 + 1, entry.1 && *cached);
        }
    }
    seen
}

fn admitted(events: &[LinkEvent]) -> usize {
    events.iter().filter(|e| matches!(e, LinkEvent::Admitted { .. })).count()
}

#[test]
fn the_observer_sees_each_phase_of_a_link_once_with_its_link_id() {
    let dir = TempDir::new("observe");
    let rec = Arc::new(Recorder::default());
    let linker = Linker::observed(
        LinkerConfig {
            toolkits: vec![cuda_home().to_path_buf()],
            cache_dir: dir.path().join("cache"),
            cache_mem: 256 << 20,
            worker_exe: Some(nvlinkd()),
            ..Default::default()
        },
        rec.clone(),
    );
    let out = TempDir::new("observe-out");
    let once = |names: &[&'static str]| -> BTreeMap<&'static str, (usize, bool)> {
        names.iter().map(|n| (*n, (1, false))).collect()
    };
    let mut every = BTreeSet::new();

    // A PTX module compiled on the pool, then nvJitLink and the finalizer.
    let (id, engine, events) = link(&linker, &rec, "--arch=sm_90 saxpy_ptx.o -o {OUT}/out.cubin", &out);
    assert_eq!(engine, EngineKind::InProcess);
    assert_eq!(phases(id, &events), once(&["plan", "jit", "jitlink", "finalize"]), "{events:#?}");
    assert_eq!(admitted(&events), 1, "{events:#?}");
    every.extend(phases(id, &events).into_keys());

    // The toolkit's contents hashed: artifact keys carry its identity, and a
    // fresh cache directory's first links key with a provisional one (the
    // two LTO links below must key alike).
    let hashed = std::time::Instant::now();
    while linker.snapshot().get("toolkits_hashing") != Some(0) {
        assert!(hashed.elapsed() < std::time::Duration::from_secs(120), "the toolkit's identity was never hashed");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }

    // Whole-program LTO: NVVM and ptxas in place of nvJitLink's link.
    const LTO: &str =
        "--arch=sm_90 -dlto -nvvmpath={NVVM} -L{L} accumulate_lto.o scale_lto.o -lcudadevrt -o {OUT}/out.cubin";
    let (id, engine, events) = link(&linker, &rec, LTO, &out);
    assert_eq!(engine, EngineKind::InProcess);
    assert_eq!(phases(id, &events), once(&["plan", "nvvm", "ptxas"]), "{events:#?}");
    every.extend(phases(id, &events).into_keys());

    // The same program again under another whole-link key (`-w`): NVVM's and
    // ptxas's results come from the artifact cache.
    let (again, _, events) = link(&linker, &rec, &format!("-w {LTO}"), &out);
    assert!(again > id, "link ids are not new: {again} after {id}");
    let cached = BTreeMap::from([("plan", (1, false)), ("nvvm", (1, true)), ("ptxas", (1, true))]);
    assert_eq!(phases(again, &events), cached, "{events:#?}");

    // A link the in-process engine declines (`-v`): the real nvlink's phase.
    let (id, engine, events) = link(&linker, &rec, "-v --arch=sm_90 accumulate.o scale.o -o {OUT}/out.cubin", &out);
    assert_eq!(engine, EngineKind::NvlinkProcess);
    assert_eq!(phases(id, &events), once(&["plan", "nvlink"]), "{events:#?}");
    assert_eq!(admitted(&events), 1, "{events:#?}");
    every.extend(phases(id, &events).into_keys());

    // Between them, these links ran every phase there is.
    assert_eq!(every, Phase::ALL.iter().map(|p| p.name()).collect::<BTreeSet<_>>());
}
