//! A simulated WAN between shims and remote daemons, for the benchmark.
//!
//! Preferred: two network namespaces joined by a veth pair, `tc netem` on
//! both ends (half the round trip each way, the rate limit), addresses from
//! the benchmarking range 198.18.0.0/30 that exist only inside the
//! namespaces. Daemons (and BuildGrid) are started from a thread switched into
//! the server namespace ([`Wan::on_server`]); shims run from threads in the
//! client namespace ([`Wan::enter_client`]). Bytes on the wire are the client
//! veth's counters (frames: Ethernet, IP and TCP headers included).
//!
//! Where namespaces or netem are refused (a kernel without `sch_netem`, no
//! `ip`/`tc`, not root), [`Wan::new`] says why and emulates the link in user
//! space instead: a TCP relay on loopback in front of each daemon port that
//! delivers each piece half a round trip later, paced at the rate (one
//! bottleneck per direction, shared by all connections), and delays a new
//! connection's first bytes by one round trip (TCP's handshake). It models
//! neither slow start nor loss; its byte counts are TCP payload (TLS records
//! included, headers not).

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

/// The server's address inside the server namespace (netem mode).
const SERVER_IP: &str = "198.18.0.1";
const CLIENT_IP: &str = "198.18.0.2";

pub struct Wan {
    mode: Mode,
    rtt: Duration,
    mbit: u64,
    /// Why netem is not used (emulated mode).
    pub netem_refused: Option<String>,
}

enum Mode {
    Netem { client_ns: String, server_ns: String, client_if: String, home: std::fs::File },
    Emulated { link: Arc<Link>, stop: Arc<AtomicBool> },
}

/// One emulated link: a bottleneck per direction and byte counters.
struct Link {
    one_way: Duration,
    bytes_per_sec: f64,
    /// When each direction's bottleneck is free again: [up, down].
    free_at: [Mutex<Instant>; 2],
    bytes: [AtomicU64; 2],
}

fn sh(args: &[&str]) -> Result<(), String> {
    let out = Command::new(args[0]).args(&args[1..]).output().map_err(|e| format!("{}: {e}", args.join(" ")))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!("{}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim()))
    }
}

/// Switch the calling thread into the network namespace `ns` (/run/netns/NAME).
fn setns_path(path: &str) -> Result<(), String> {
    let f = std::fs::File::open(path).map_err(|e| format!("{path}: {e}"))?;
    setns_file(&f)
}

fn setns_file(f: &std::fs::File) -> Result<(), String> {
    // SAFETY: setns on an open namespace descriptor; affects this thread only.
    if unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) } == 0 {
        Ok(())
    } else {
        Err(format!("setns: {}", std::io::Error::last_os_error()))
    }
}

impl Wan {
    /// A link of round trip `rtt` and `mbit` Mbit/s each way: netem where the
    /// machine allows it, else emulated (see the module docs).
    pub fn new(rtt: Duration, mbit: u64) -> Wan {
        match Self::netem(rtt, mbit) {
            Ok(mode) => Wan { mode, rtt, mbit, netem_refused: None },
            Err(why) => {
                let mut wan = Wan::emulated(rtt, mbit);
                wan.netem_refused = Some(why);
                wan
            }
        }
    }

    /// The emulated link alone (a relay on loopback that counts the bytes of
    /// each direction), whatever the machine allows: for tests.
    pub fn emulated(rtt: Duration, mbit: u64) -> Wan {
        let link = Link {
            one_way: rtt / 2,
            bytes_per_sec: mbit as f64 * 1e6 / 8.0,
            free_at: [Mutex::new(Instant::now()), Mutex::new(Instant::now())],
            bytes: [AtomicU64::new(0), AtomicU64::new(0)],
        };
        let mode = Mode::Emulated { link: Arc::new(link), stop: Arc::new(AtomicBool::new(false)) };
        Wan { mode, rtt, mbit, netem_refused: Some("emulated on request".into()) }
    }

    fn netem(rtt: Duration, mbit: u64) -> Result<Mode, String> {
        let id = std::process::id() % 100_000;
        let (client_ns, server_ns) = (format!("nvlb-c{id}"), format!("nvlb-s{id}"));
        let (client_if, server_if) = (format!("nvlbc{id}"), format!("nvlbs{id}"));
        let home = std::fs::File::open("/proc/thread-self/ns/net").map_err(|e| format!("own namespace: {e}"))?;
        let cleanup = |c: &str, s: &str| {
            let _ = sh(&["ip", "netns", "del", c]);
            let _ = sh(&["ip", "netns", "del", s]);
        };
        let delay = format!("{}us", rtt.as_micros() / 2);
        let rate = format!("{mbit}mbit");
        let setup = || -> Result<(), String> {
            sh(&["ip", "netns", "add", &client_ns])?;
            sh(&["ip", "netns", "add", &server_ns])?;
            sh(&[
                "ip", "link", "add", &client_if, "netns", &client_ns, "type", "veth", "peer", "name", &server_if,
                "netns", &server_ns,
            ])?;
            for (ns, dev, ip) in [(&client_ns, &client_if, CLIENT_IP), (&server_ns, &server_if, SERVER_IP)] {
                sh(&["ip", "-n", ns, "addr", "add", &format!("{ip}/30"), "dev", dev])?;
                sh(&["ip", "-n", ns, "link", "set", dev, "up"])?;
                sh(&["ip", "-n", ns, "link", "set", "lo", "up"])?;
                sh(&["tc", "-n", ns, "qdisc", "add", "dev", dev, "root", "netem", "delay", &delay, "rate", &rate])?;
            }
            Ok(())
        };
        if let Err(e) = setup() {
            cleanup(&client_ns, &server_ns);
            return Err(e);
        }
        Ok(Mode::Netem { client_ns, server_ns, client_if, home })
    }

    pub fn describe(&self) -> String {
        let what = match &self.mode {
            Mode::Netem { .. } => "network namespaces + tc netem".to_string(),
            Mode::Emulated { .. } => "user-space relay (netem refused: see above)".to_string(),
        };
        format!("{} ms RTT, {} Mbit/s each way, {what}", self.rtt.as_millis(), self.mbit)
    }

    /// The address daemons listen on.
    pub fn server_ip(&self) -> &'static str {
        match self.mode {
            Mode::Netem { .. } => SERVER_IP,
            Mode::Emulated { .. } => "127.0.0.1",
        }
    }

    /// Names the daemons' TLS certificate must carry.
    pub fn cert_hosts(&self) -> Vec<&'static str> {
        vec![self.server_ip(), "127.0.0.1", "localhost"]
    }

    /// Run `f` with this thread in the server's namespace: processes it
    /// starts (daemons, BuildGrid) live there.
    pub fn on_server<T>(&self, f: impl FnOnce() -> T) -> T {
        match &self.mode {
            Mode::Netem { server_ns, .. } => {
                let here = std::fs::File::open("/proc/thread-self/ns/net").expect("this thread's namespace");
                setns_path(&format!("/run/netns/{server_ns}")).expect("enter the server namespace");
                let r = f();
                setns_file(&here).expect("leave the server namespace");
                r
            }
            Mode::Emulated { .. } => f(),
        }
    }

    /// Put this thread (and the threads and processes it starts later) on
    /// the client's side of the link.
    pub fn enter_client(&self) {
        if let Mode::Netem { client_ns, .. } = &self.mode {
            setns_path(&format!("/run/netns/{client_ns}")).expect("enter the client namespace");
        }
    }

    /// Back to the namespace this thread started in.
    pub fn leave_client(&self) {
        if let Mode::Netem { home, .. } = &self.mode {
            setns_file(home).expect("leave the client namespace");
        }
    }

    /// `HOST:PORT` by which a shim on the client side reaches a daemon port
    /// on the server side (emulated: a relay started for it).
    pub fn expose(&self, port: u16) -> String {
        match &self.mode {
            Mode::Netem { .. } => format!("{SERVER_IP}:{port}"),
            Mode::Emulated { link, stop } => {
                let listener = TcpListener::bind("127.0.0.1:0").expect("relay port");
                let addr = listener.local_addr().expect("relay address");
                listener.set_nonblocking(true).expect("nonblocking relay");
                let (link, stop) = (link.clone(), stop.clone());
                std::thread::spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        match listener.accept() {
                            Ok((client, _)) => {
                                let _ = client.set_nonblocking(false);
                                let link = link.clone();
                                std::thread::spawn(move || relay(client, port, link));
                            }
                            Err(_) => std::thread::sleep(Duration::from_millis(1)),
                        }
                    }
                });
                format!("127.0.0.1:{}", addr.port())
            }
        }
    }

    /// Bytes sent so far towards the daemons and back (see the module docs).
    pub fn wire_bytes(&self) -> (u64, u64) {
        match &self.mode {
            Mode::Netem { client_ns, client_if, .. } => {
                let out = Command::new("ip")
                    .args(["-n", client_ns, "-s", "-j", "link", "show", "dev", client_if])
                    .output()
                    .expect("ip -s link");
                let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("ip -j output");
                let s = &v[0]["stats64"];
                (s["tx"]["bytes"].as_u64().unwrap_or(0), s["rx"]["bytes"].as_u64().unwrap_or(0))
            }
            Mode::Emulated { link, .. } => {
                (link.bytes[0].load(Ordering::Relaxed), link.bytes[1].load(Ordering::Relaxed))
            }
        }
    }
}

impl Drop for Wan {
    fn drop(&mut self) {
        match &self.mode {
            Mode::Netem { client_ns, server_ns, .. } => {
                let _ = sh(&["ip", "netns", "del", client_ns]);
                let _ = sh(&["ip", "netns", "del", server_ns]);
            }
            Mode::Emulated { stop, .. } => stop.store(true, Ordering::Relaxed),
        }
    }
}

/// Relay one connection to the daemon's `port` through the emulated link.
fn relay(client: TcpStream, port: u16, link: Arc<Link>) {
    let Ok(server) = TcpStream::connect(("127.0.0.1", port)) else { return };
    let _ = (client.set_nodelay(true), server.set_nodelay(true));
    let (Ok(c2), Ok(s2)) = (client.try_clone(), server.try_clone()) else { return };
    let up = {
        let link = link.clone();
        std::thread::spawn(move || pump(client, server, &link, 0))
    };
    pump(s2, c2, &link, 1);
    let _ = up.join();
}

/// Copy `from` to `to` with the link's delay and rate for `dir` (0 up, 1 down).
fn pump(mut from: TcpStream, to: TcpStream, link: &Link, dir: usize) {
    let (tx, rx) = mpsc::channel::<(Instant, Vec<u8>)>();
    let writer = std::thread::spawn(move || {
        let mut to = to;
        for (at, data) in rx {
            let now = Instant::now();
            if at > now {
                std::thread::sleep(at - now);
            }
            if to.write_all(&data).is_err() {
                break;
            }
        }
        let _ = to.shutdown(Shutdown::Write);
    });
    let mut buf = vec![0u8; 64 << 10];
    // A new connection's first bytes wait for TCP's handshake (one round trip).
    let mut last = Instant::now() + link.one_way * 2;
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        link.bytes[dir].fetch_add(n as u64, Ordering::Relaxed);
        let serialize = Duration::from_secs_f64(n as f64 / link.bytes_per_sec);
        let done = {
            let mut free = link.free_at[dir].lock().unwrap();
            let start = (*free).max(Instant::now());
            *free = start + serialize;
            *free
        };
        last = last.max(done + link.one_way);
        if tx.send((last, buf[..n].to_vec())).is_err() {
            break;
        }
    }
    drop(tx);
    let _ = writer.join();
    let _ = from.shutdown(Shutdown::Read);
}
