//! A probe in place of nvlink (tests/tests/confine.rs): started by the daemon
//! as its toolkit's nvlink, it tries what a process parsing a client's bytes
//! must not do, and reports each attempt on stdout as `<what>: allowed` or
//! `<what>: refused (<error>)`, then exits 1 (so the report is the link's
//! answer). `--version` runs the real nvlink instead (the daemon asks it when
//! it opens the toolkit).
//!
//! What to try comes from `probe.conf` beside the probe, `key=value` lines:
//! `real` (the real nvlink), `secret` (a file to read), `outside` (a file to
//! create), `tcp` (an address to connect to), `unix` (a socket to connect to),
//! `exec` (a program to run); with `plant` (a file the probe may not read),
//! it only makes its `-o` file a symlink to that file and exits 0, as a
//! compromised nvlink would to have the daemon read the file for it.

use std::io::Read;
use std::path::{Path, PathBuf};

fn outcome<T>(what: &str, r: std::io::Result<T>) {
    match r {
        Ok(_) => println!("{what}: allowed"),
        Err(e) => println!("{what}: refused ({e})"),
    }
}

fn main() {
    let me = PathBuf::from(std::env::args().next().unwrap_or_default());
    let conf_path = me.parent().unwrap_or(Path::new(".")).join("probe.conf");
    let conf = std::fs::read_to_string(&conf_path).unwrap_or_default();
    let get = |k: &str| conf.lines().find_map(|l| l.strip_prefix(k).and_then(|r| r.strip_prefix('=')));
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--version") {
        use std::os::unix::process::CommandExt;
        let real = get("real").expect("probe.conf: real=");
        let e = std::process::Command::new(real).args(&args).exec();
        eprintln!("probe: cannot run {real}: {e}");
        std::process::exit(127);
    }
    if let Some(target) = get("plant") {
        let o = args.iter().position(|a| a == "-o").and_then(|i| args.get(i + 1));
        let o = o.cloned().or_else(|| args.iter().find_map(|a| a.strip_prefix("-o=").map(str::to_owned)));
        let o = o.expect("an -o argument");
        let _ = std::fs::remove_file(&o);
        outcome("plant", std::os::unix::fs::symlink(target, &o));
        std::process::exit(0);
    }
    if let Some(p) = get("secret") {
        outcome("read secret", std::fs::File::open(p).and_then(|mut f| f.read_to_string(&mut String::new())));
    }
    if let Some(p) = get("outside") {
        outcome("write outside", std::fs::write(p, b"probe"));
    }
    if let Some(a) = get("tcp") {
        outcome("connect tcp", std::net::TcpStream::connect(a));
    }
    if let Some(p) = get("unix") {
        outcome("connect unix", std::os::unix::net::UnixStream::connect(p));
    }
    if let Some(p) = get("exec") {
        outcome("run program", std::process::Command::new(p).output());
    }
    // A socket through x86-64's x32 ABI (the same call under another number):
    // refused as `socket` itself is, whether or not this kernel has x32
    // (without it the call is unknown: "Function not implemented").
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: socket(2) with plain integer arguments; the descriptor, if any, is closed below.
        let fd = unsafe { libc::syscall(0x4000_0000 | libc::SYS_socket, libc::AF_INET, libc::SOCK_STREAM, 0) };
        let r = if fd < 0 { Err(std::io::Error::last_os_error()) } else { Ok(fd) };
        if let Ok(fd) = r {
            // SAFETY: our own descriptor.
            unsafe { libc::close(fd as i32) };
        }
        outcome("x32 socket", r);
    }
    // SAFETY: getuid cannot fail.
    println!("uid: {}", unsafe { libc::getuid() });
    // What it may do: write in its working directory (the sandbox).
    outcome("write sandbox", std::fs::write("probe-was-here", b"probe"));
    std::process::exit(1);
}
