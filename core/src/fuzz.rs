//! Entry points for fuzzing the readers of untrusted bytes. `core/fuzz`
//! (cargo fuzz) drives them with generated inputs, and the regression test
//! `core/tests/fuzz_regressions.rs` replays every crash ever found. None of them
//! may panic, hang or allocate without bound on any input.

use std::io;
use std::path::Path;
use std::sync::Arc;

use crate::cli::target::Target;
use crate::cli::{parse, render, spec::Spec};
use crate::elf::Elf;
use crate::fatbin;
use crate::finalize::{image::CubinImage, strtab::StrTab, tkinfo};
use crate::fs::{FileStat, InputFs, LocalFs};
use crate::input::load::LoadContext;
use crate::input::{archive, classify, cubin, host::HostObject, ptx};

/// The command line: NUL-separated arguments.
pub fn cli(data: &[u8]) {
    let args: Vec<String> = data.split(|&b| b == 0).map(|a| String::from_utf8_lossy(a).into_owned()).collect();
    if let Ok(parsed) = parse::parse(&args, &LocalFs, Path::new("/nonexistent-fuzz-cwd")) {
        let _ = render::options_string(&parsed);
        if let Ok(spec) = Spec::from_parsed(parsed, Path::new("/nonexistent-fuzz-cwd"), None) {
            let _ = spec.mode();
            let _ = spec.target();
        }
    }
    let _ = parse::split_words(&String::from_utf8_lossy(data));
}

/// ELF readers, cubin info, the finalizer's image round trip, notes, string tables.
pub fn elf(data: &[u8]) {
    if let Ok(elf) = Elf::parse(data) {
        let _ = elf.symbols();
        let _ = HostObject::read(&elf).module_ids();
        for s in &elf.sections {
            let _ = elf.section_data(s);
        }
    }
    let _ = cubin::read(data);
    if let Ok(img) = CubinImage::parse(data) {
        let _ = img.serialize();
    }
    // Line tables, as diagnostics read them from a link's objects.
    for symbol in ["", "_Z6helperi", "k"] {
        let _ = crate::input::lines::locate(data, symbol);
    }
    let _ = tkinfo::parse(data);
    if let Ok(t) = StrTab::parse(data) {
        let _ = t.to_bytes();
    }
}

/// Fatbin containers and members; content sniffing; PTX declarations.
pub fn fatbin(data: &[u8]) {
    for members in [fatbin::parse(data), fatbin::parse_first(data)].into_iter().flatten() {
        for m in members {
            let _ = m.contents();
        }
    }
    let _ = classify::classify(data);
    let _ = ptx::symbols(&String::from_utf8_lossy(data));
}

/// `ar` archives.
pub fn archive(data: &[u8]) {
    let _ = archive::members(data);
}

struct OneFile(Arc<[u8]>);

impl InputFs for OneFile {
    fn read(&self, _: &Path) -> io::Result<Arc<[u8]>> {
        Ok(self.0.clone())
    }
    fn stat(&self, _: &Path) -> io::Result<FileStat> {
        Ok(FileStat { is_dir: false, size: self.0.len() as u64 })
    }
}

/// The input decision tree on one file, under each name nvlink treats differently.
pub fn inputs(data: &[u8]) {
    let fs = OneFile(data.to_vec().into());
    for lto in [false, true] {
        let ctx = LoadContext {
            fs: &fs,
            cwd: Path::new("/w"),
            target: Target { sm: 90, suffix: None },
            lto,
            suppress_arch_warning: false,
            memo: None,
            cpu_machine: crate::input::load::cpu_machine(None),
            decompressed: Default::default(),
        };
        for name in ["x.o", "x.cubin", "x.ptx", "x.fatbin", "x.a", "x.ltoir", "x"] {
            let _ = ctx.input(name);
        }
        let candidate = crate::input::files::Named { given: "lib/libx.a".into(), path: "/w/lib/libx.a".into() };
        let _ = ctx.library(&crate::input::files::LibrarySearch { name: "x".into(), candidates: vec![candidate] });
    }
}
