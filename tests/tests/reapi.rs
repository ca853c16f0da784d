//! The shared cache tier on a real Remote Execution API server (BuildGrid):
//! two daemons with their own cache directories share whole links and LTO
//! artifacts through it; a tampered blob in BuildGrid's storage is rejected; an
//! unreachable or silent server never fails a link; a busy one is waited for.
//! Every result is compared with the real nvlink's.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use bazel_remote_apis::build::bazel::remote::execution::v2 as re;
use prost::Message;
use re::action_cache_client::ActionCacheClient;

use nvlinkd_tests::buildgrid::BuildGrid;
use nvlinkd_tests::compare;
use nvlinkd_tests::corpus;
use nvlinkd_tests::daemon::Daemon;
use nvlinkd_tests::env::{nvlinkd, real_nvlink, shim, write_private, TempDir};
use nvlinkd_tests::run::{run, Invocation, Run};

const LINK: &str =
    "--arch=sm_90 -L{L} --register-link-binaries={OUT}/reg.c cdp.o accumulate.o scale.o -lcudadevrt -o {OUT}/out.cubin";
const LTO: &str =
    "--arch=sm_90 -dlto -nvvmpath={NVVM} -L{L} accumulate_lto.o scale_lto.o -lcudadevrt -o {OUT}/out.cubin";

fn inv(args: &str, out: &TempDir) -> Invocation {
    Invocation::templated(args, corpus::dir(), out)
}

fn same(expected: &Run, actual: &Run) {
    let cmp = compare::runs(expected, actual);
    assert!(cmp.problems.is_empty() && cmp.identical, "{:?}", cmp.problems);
}

fn daemon(url: &str) -> Daemon {
    Daemon::start_with(&["--remote-cache", url, "--remote-timeout", "5s"])
}

/// Wait until `d` has no upload waiting (uploads are queued before the link
/// answers), then check that at least `n` succeeded.
fn wait_uploads(d: &Daemon, n: u64) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let s = d.stats();
        if s["remote_cache_uploads_pending"].as_u64() == Some(0) {
            let done = s["remote_cache_uploads"].as_u64().unwrap_or(0);
            assert!(done >= n, "{done} uploads, expected {n}: {s}");
            return;
        }
        assert!(Instant::now() < deadline, "uploads did not finish: {s}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn two_daemons_share_links_and_lto_artifacts_through_buildgrid() {
    let Some(bg) = BuildGrid::start() else { return };
    let out = TempDir::new("rp1");
    let lto_registered = format!("{LTO} --register-link-binaries={{OUT}}/reg.c");
    let expected: Vec<Run> =
        [LINK, LTO, &lto_registered].iter().map(|l| run(&real_nvlink(), &inv(l, &out), &[])).collect();

    // Daemon A computes both links and uploads them (and its NVVM and ptxas artifacts).
    let a = daemon(&bg.url());
    same(&expected[0], &run(&shim(), &inv(LINK, &out), &a.shim_env()));
    same(&expected[1], &run(&shim(), &inv(LTO, &out), &a.shim_env()));
    assert_eq!(a.stat("cache_misses"), 2);
    assert_eq!(a.stat("remote_cache_hits"), 0, "BuildGrid started empty");
    // Two whole links, one NVVM and one ptxas artifact at least.
    wait_uploads(&a, 4);
    assert_eq!(a.stat("remote_cache_upload_errors"), 0, "{}", bg.log());

    // Daemon B, with its own empty cache directory: the LTO link with another
    // output set is a different whole link, but its NVVM and ptxas steps are
    // A's, served by BuildGrid.
    let b = daemon(&bg.url());
    assert_ne!(a.cache_dir(), b.cache_dir());
    same(&expected[2], &run(&shim(), &inv(&lto_registered, &out), &b.shim_env()));
    assert_eq!(b.stat("cache_misses"), 1, "the whole link differs from A's");
    assert_eq!((b.stat("nvvm_hits"), b.stat("ptxas_hits")), (1, 1), "A's LTO steps were not shared");
    assert_eq!(b.stat("remote_cache_hits"), 2);

    // A's whole links: hits in B, byte-identical to nvlink's.
    same(&expected[0], &run(&shim(), &inv(LINK, &out), &b.shim_env()));
    same(&expected[1], &run(&shim(), &inv(LTO, &out), &b.shim_env()));
    assert_eq!(b.stat("cache_hits"), 2, "A's links were not found through BuildGrid");
    let remote_hits = b.stat("remote_cache_hits");
    assert!(remote_hits >= 4, "remote hits {remote_hits}");
    assert_eq!(b.stat("remote_cache_rejected"), 0);

    // A remote hit fills the local tiers: the next time is local.
    same(&expected[0], &run(&shim(), &inv(LINK, &out), &b.shim_env()));
    assert_eq!(b.stat("cache_hits"), 3);
    assert_eq!(b.stat("remote_cache_hits"), remote_hits, "a remote hit was not kept locally");
}

#[test]
fn tampered_blobs_in_buildgrid_are_rejected() {
    let Some(bg) = BuildGrid::start() else { return };
    let out = TempDir::new("rp2");
    let link = "--arch=sm_90 tmpl_a.o tmpl_b.o -o {OUT}/out.cubin";
    let expected = run(&real_nvlink(), &inv(link, &out), &[]);
    let a = daemon(&bg.url());
    same(&expected, &run(&shim(), &inv(link, &out), &a.shim_env()));
    wait_uploads(&a, 1);

    // Damage every nvlinkd entry in BuildGrid's disk storage, keeping sizes:
    // the server still serves them (it does not check), nvlinkd must not.
    let mut tampered = 0;
    for blob in bg.blobs() {
        let mut b = std::fs::read(&blob).unwrap();
        if b.starts_with(b"nvlkdr01") {
            let n = b.len();
            b[n - 1] ^= 0x5a;
            std::fs::write(&blob, b).unwrap();
            tampered += 1;
        }
    }
    assert!(tampered >= 1, "no nvlinkd entry found in BuildGrid's storage");

    let b = daemon(&bg.url());
    same(&expected, &run(&shim(), &inv(link, &out), &b.shim_env()));
    assert_eq!(b.stat("remote_cache_hits"), 0, "a tampered blob was served");
    assert!(b.stat("remote_cache_rejected") >= 1, "{}", b.stats());
    assert_eq!(b.stat("cache_misses"), 1);
}

#[test]
fn entries_beyond_the_batch_limit_go_through_bytestream() {
    let Some(bg) = BuildGrid::start() else { return };
    let out = TempDir::new("rp4");
    let expected = run(&real_nvlink(), &inv(LINK, &out), &[]);
    // Every blob is over this limit: uploads are ByteStream writes (in chunks
    // past 1 MiB), downloads ByteStream reads.
    let env = [("NVLINKD_TEST_REMOTE_BATCH_BYTES", "100")];
    let url = bg.url();
    let args = ["--remote-cache", &url, "--remote-timeout", "5s"];
    let a = Daemon::start_env(&args, &env);
    same(&expected, &run(&shim(), &inv(LINK, &out), &a.shim_env()));
    wait_uploads(&a, 1);
    assert_eq!(a.stat("remote_cache_upload_errors"), 0, "{}", bg.log());
    let b = Daemon::start_env(&args, &env);
    same(&expected, &run(&shim(), &inv(LINK, &out), &b.shim_env()));
    assert_eq!((b.stat("cache_hits"), b.stat("remote_cache_hits")), (1, 1), "{}", b.stats());
    // The envelope (and the Action and Command) went up, the envelope came down, by ByteStream.
    assert!(a.stat("remote_cache_stream_writes") >= 1);
    assert_eq!(b.stat("remote_cache_stream_reads"), 1);
}

#[test]
fn tls_and_a_token_reach_a_secured_buildgrid() {
    let Some((bg, secured)) = BuildGrid::start_secure() else { return };
    let out = TempDir::new("rp5");
    let link = "--arch=sm_90 tmpl_a.o tmpl_b.o -o {OUT}/out.cubin";
    let expected = run(&real_nvlink(), &inv(link, &out), &[]);
    let url = bg.url();
    assert!(url.starts_with("grpcs://"));
    let (ca, token) = (secured.ca.display().to_string(), secured.token_file.display().to_string());
    let with_token =
        ["--remote-cache", &url, "--remote-timeout", "5s", "--remote-ca", &ca, "--remote-token-file", &token];

    // Without the token: refused (UNAUTHENTICATED), the link is still right.
    let anonymous = Daemon::start_with(&with_token[..6]);
    same(&expected, &run(&shim(), &inv(link, &out), &anonymous.shim_env()));
    let deadline = Instant::now() + Duration::from_secs(60);
    while anonymous.stat("remote_cache_uploads_pending") > 0 {
        assert!(Instant::now() < deadline, "upload still pending");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(anonymous.stat("remote_cache_uploads"), 0, "BuildGrid accepted an upload without the token");
    assert!(anonymous.stat("remote_cache_errors") + anonymous.stat("remote_cache_upload_errors") >= 1);

    // With TLS checked against the test CA and the token: shared.
    let a = Daemon::start_with(&with_token);
    same(&expected, &run(&shim(), &inv(link, &out), &a.shim_env()));
    wait_uploads(&a, 1);
    let b = Daemon::start_with(&with_token);
    same(&expected, &run(&shim(), &inv(link, &out), &b.shim_env()));
    assert_eq!(b.stat("remote_cache_hits"), 1, "{}", b.stats());
}

/// Links that differ (so none is a cache hit of another).
const DISTINCT: [&str; 4] = [
    "--arch=sm_90 tmpl_a.o tmpl_b.o -o {OUT}/out.cubin",
    "--arch=sm_90 -L{L} cdp.o -lcudadevrt -o {OUT}/out.cubin",
    "--arch=sm_90 vars_def.o vars_use.o -o {OUT}/out.cubin",
    "--arch=sm_90 -L{L} cdp.o accumulate.o scale.o -lcudadevrt -o {OUT}/out.cubin",
];

/// Links through a daemon whose shared tier never answers: all correct, the
/// failures counted, and after repeated failures the tier skipped.
#[test]
fn the_same_toolkit_installed_on_another_host_shares_the_tier() {
    let Some(bg) = BuildGrid::start() else { return };
    let (out, host) = (TempDir::new("rp-host"), TempDir::new("rp-cuda"));
    let home = host.path().join("cuda");
    let expected = run(&real_nvlink(), &inv(LINK, &out), &[]);
    let on = |d: &Daemon| {
        let mut env = d.shim_env();
        env.retain(|(k, _)| k != "CUDA_HOME");
        env.push(("CUDA_HOME".into(), home.display().to_string()));
        env
    };
    let serve = |home: &Path| {
        let home = home.display().to_string();
        Daemon::start_with(&["--cuda-home", &home, "--remote-cache", &bg.url(), "--remote-timeout", "5s"])
    };

    // Host A: the link computed and uploaded.
    nvlinkd_tests::env::install_toolkit_copy(&home);
    let mut a = serve(&home);
    same(&expected, &run(&shim(), &inv(LINK, &out), &on(&a)));
    assert_eq!(a.stat("cache_misses"), 1);
    wait_uploads(&a, 1);
    a.stop();

    // Host B: the same toolkit at the same place, other files on disk (new
    // inodes, device-independent), its own empty cache: A's answer is found.
    nvlinkd_tests::env::install_toolkit_copy(&home);
    let b = serve(&home);
    assert_ne!(a.cache_dir(), b.cache_dir());
    same(&expected, &run(&shim(), &inv(LINK, &out), &on(&b)));
    assert_eq!(b.stat("cache_hits"), 1, "the same toolkit elsewhere missed A's entry");
    assert!(b.stat("remote_cache_hits") >= 1);
}

fn links_survive(url: &str) {
    let d = Daemon::start_with(&["--remote-cache", url, "--remote-timeout", "300ms"]);
    let out = TempDir::new("rp3");
    for link in DISTINCT {
        let expected = run(&real_nvlink(), &inv(link, &out), &[]);
        same(&expected, &run(&shim(), &inv(link, &out), &d.shim_env()));
    }
    let s = d.stats();
    assert_eq!(s["cache_misses"].as_u64(), Some(DISTINCT.len() as u64), "{s}");
    assert_eq!(s["remote_cache_hits"].as_u64(), Some(0), "{s}");
    assert!(s["remote_cache_errors"].as_u64().unwrap() >= 1, "{s}");
    // The breaker opened after three failures in a row: later calls are skipped.
    assert!(s["remote_cache_skipped"].as_u64().unwrap() >= 1, "{s}");
}

/// BuildGrid's only call slot (`BuildGrid::start_with_call_limit(1)`), held
/// by a ByteStream write that never finishes until the returned task is
/// aborted; returns once BuildGrid refuses another call as busy.
fn hold_the_only_call(bg: &BuildGrid, rt: &tokio::runtime::Runtime) -> tokio::task::JoinHandle<()> {
    use bazel_remote_apis::google::bytestream::{byte_stream_client::ByteStreamClient, WriteRequest};
    use re::capabilities_client::CapabilitiesClient;
    let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{}", bg.addr)).unwrap();
    let channel = rt.block_on(endpoint.connect()).expect("connect to BuildGrid");
    let hold = || {
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        let first = WriteRequest {
            resource_name: format!("uploads/00000000-0000-4000-8000-000000000001/blobs/{}/2", "ab".repeat(32)),
            write_offset: 0,
            finish_write: false,
            data: vec![0],
        };
        tx.try_send(first).unwrap();
        let mut writer = ByteStreamClient::new(channel.clone());
        rt.spawn(async move {
            // The request stream stays open while the task lives.
            let _open = tx;
            let _ = writer.write(tokio_stream::wrappers::ReceiverStream::new(rx)).await;
        })
    };
    let mut held = hold();
    let mut caps = CapabilitiesClient::new(channel.clone());
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        // The write ends only when refused (the probe below had the slot).
        if held.is_finished() {
            held = hold();
        }
        match rt.block_on(caps.get_capabilities(re::GetCapabilitiesRequest::default())) {
            Err(s) if s.code() == tonic::Code::ResourceExhausted && !held.is_finished() => return held,
            other => assert!(Instant::now() < deadline, "BuildGrid never refused a call as busy: {other:?}"),
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A server that refuses calls as busy (BuildGrid at its concurrent-RPC
/// limit, as a fleet's replicas in a burst take it: `RESOURCE_EXHAUSTED`)
/// has not failed: the daemon's calls wait and go again, and what it computed
/// is shared. Counted as failures, three refusals opened the breaker, and the
/// uploads of the next 30 s were skipped (a replacement replica then missed
/// links of the burst, tests/tests/replicas.rs). Here BuildGrid serves one
/// call at a time and the test holds that one until the daemon was refused.
#[test]
fn a_busy_remote_cache_is_waited_for_not_failed() {
    let Some(bg) = BuildGrid::start_with_call_limit(1) else { return };
    let out = TempDir::new("rp-busy");
    let expected = run(&real_nvlink(), &inv(LINK, &out), &[]);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let held = hold_the_only_call(&bg, &rt);
    // A deadline the refusals do not outlast while the test watches.
    let a = Daemon::start_with(&["--remote-cache", &bg.url(), "--remote-timeout", "60s"]);
    std::thread::scope(|s| {
        let link = s.spawn(|| run(&shim(), &inv(LINK, &out), &a.shim_env()));
        a.wait_stat("remote_cache_busy", 1);
        held.abort();
        same(&expected, &link.join().expect("shim thread"));
    });
    wait_uploads(&a, 1);
    let s = a.stats();
    for failed in ["remote_cache_errors", "remote_cache_upload_errors", "remote_cache_skipped"] {
        assert_eq!(s[failed].as_u64(), Some(0), "{failed}: {s}");
    }
    assert_eq!(s["cache_misses"].as_u64(), Some(1), "{s}");

    // Shared: another daemon, its own cache empty, gets the link from the tier.
    let b = daemon(&bg.url());
    same(&expected, &run(&shim(), &inv(LINK, &out), &b.shim_env()));
    assert_eq!(b.stat("cache_hits"), 1, "{}", b.stats());
}

#[test]
fn a_silent_remote_cache_never_fails_a_link() {
    // A port that accepts connections (the kernel's backlog) and never answers.
    let blackhole = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    links_survive(&format!("grpc://{}", blackhole.local_addr().unwrap()));
}

#[test]
fn a_stopped_remote_cache_never_fails_a_link() {
    // A port nothing listens on any more: connections are refused.
    let addr = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    links_survive(&format!("grpc://{addr}"));
}

/// The fleet key (`--remote-cache-key`): an entry is served only when the
/// fleet's key authenticates it. A daemon of another key, or of none, that
/// writes a wrong output (its in-process engine damaged by a test hook, as a
/// forger's would be) gets nothing served to the fleet; daemons of the same
/// key share as before.
#[test]
fn entries_not_authenticated_by_the_fleet_key_are_never_served() {
    let Some(bg) = BuildGrid::start() else { return };
    let keys = TempDir::new("rp-keys");
    let (fleet, other) = (keys.path().join("fleet.key"), keys.path().join("other.key"));
    write_private(&fleet, b"the fleet's secret, 32 bytes or more, shared by its daemons");
    write_private(&other, b"someone else's key");
    let (fleet, other) = (fleet.display().to_string(), other.display().to_string());
    let out = TempDir::new("rp-key-out");
    let expected = run(&real_nvlink(), &inv(LINK, &out), &[]);
    let corrupt = [("NVLINKD_TEST_CORRUPT_IN_PROCESS", "1")];
    let url = bg.url();
    let with_key = |key: Option<&str>, env: &[(&str, &str)]| {
        let mut args = vec!["--remote-cache", url.as_str(), "--remote-timeout", "5s"];
        if let Some(k) = key {
            args.extend(["--remote-cache-key", k]);
        }
        Daemon::start_env(&args, env)
    };

    // Forgers: one with another key, one with none, each storing a wrong output.
    for key in [Some(other.as_str()), None] {
        let forger = with_key(key, &corrupt);
        let forged = run(&shim(), &inv(LINK, &out), &forger.shim_env());
        assert!(!compare::runs(&expected, &forged).identical, "the test hook did not damage the output");
        wait_uploads(&forger, 1);
    }
    // A daemon of the fleet, with an empty cache: nvlink's bytes.
    let member = with_key(Some(&fleet), &[]);
    same(&expected, &run(&shim(), &inv(LINK, &out), &member.shim_env()));
    assert_eq!(member.stat("remote_cache_hits"), 0, "a forged entry was served: {}", member.stats());
    assert!(member.stat("remote_cache_rejected") >= 1, "the other key's entry was not rejected: {}", member.stats());
    wait_uploads(&member, 1);
    // Another member of the fleet shares what the first stored.
    let second = with_key(Some(&fleet), &[]);
    same(&expected, &run(&shim(), &inv(LINK, &out), &second.shim_env()));
    assert_eq!(second.stat("cache_hits"), 1, "the fleet's entry was not shared: {}", second.stats());
    assert!(second.stat("remote_cache_hits") >= 1);
}

/// The name of a blob file of BuildGrid's disk CAS (`objects/ab/cdef…`): its hash.
fn blob_hash(file: &Path) -> String {
    let shard = file.parent().and_then(|p| p.file_name()).unwrap().to_string_lossy();
    format!("{shard}{}", file.file_name().unwrap().to_string_lossy())
}

/// The action digests of the entries of `kind` daemons stored in `bg`:
/// Actions in BuildGrid's CAS whose Command is nvlinkd's for `kind`, as
/// anyone who can read the CAS finds them.
fn stored_actions(bg: &BuildGrid, kind: &str) -> Vec<re::Digest> {
    let blobs = bg.blobs();
    let mut found = Vec::new();
    for file in &blobs {
        let bytes = std::fs::read(file).unwrap();
        let Some(command) = re::Action::decode(&bytes[..]).ok().and_then(|a| a.command_digest) else { continue };
        let Some(command) = blobs.iter().find(|f| blob_hash(f) == command.hash) else { continue };
        let Ok(command) = re::Command::decode(&std::fs::read(command).unwrap()[..]) else { continue };
        if command.arguments.first().map(String::as_str) == Some("nvlinkd-cache")
            && command.arguments.get(2).map(String::as_str) == Some(kind)
        {
            found.push(re::Digest { hash: blob_hash(file), size_bytes: bytes.len() as i64 });
        }
    }
    assert!(!found.is_empty(), "no nvlinkd {kind} entry in BuildGrid's CAS");
    found
}

/// A blob of `size` bytes in BuildGrid's disk CAS (a sparse file: BuildGrid
/// serves it as it is, under a made-up SHA-256 hash), as a forger who can
/// write to the CAS stores one.
fn huge_blob(bg: &BuildGrid, size: u64) -> re::Digest {
    let hash = format!("{:064x}", 0xf0f0_u64 + size);
    let dir: PathBuf = bg.dir.path().join("storage/cas/objects").join(&hash[..2]);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::File::create(dir.join(&hash[2..])).unwrap().set_len(size).unwrap();
    re::Digest { hash, size_bytes: size as i64 }
}

/// A forger without the fleet key: the ActionResult stored under `action`
/// is rewritten to name `blob` as its output, everything else kept as the
/// daemon wrote it.
fn forge(bg: &BuildGrid, action: &re::Digest, blob: &re::Digest) {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", bg.addr)).unwrap().connect().await;
        let mut ac = ActionCacheClient::new(channel.unwrap());
        let get = re::GetActionResultRequest { action_digest: Some(action.clone()), ..Default::default() };
        let mut result = ac.get_action_result(get).await.unwrap().into_inner();
        assert!(!result.output_files.is_empty(), "{result:?}");
        for f in &mut result.output_files {
            f.digest = Some(blob.clone());
        }
        let update = re::UpdateActionResultRequest {
            action_digest: Some(action.clone()),
            action_result: Some(result),
            ..Default::default()
        };
        ac.update_action_result(update).await.unwrap();
    });
}

/// An entry of the shared tier names a 64 MiB blob its writer did not have
/// the fleet key to authenticate: the entry's own MAC (in its ActionResult)
/// is checked first, so the daemon refuses it without reading the blob, and
/// links as nvlink does. (A forger could make every lookup download up to
/// 257 MiB before the envelope's MAC said no.)
#[test]
fn a_forged_entry_is_refused_before_its_blob_is_downloaded() {
    let Some(bg) = BuildGrid::start() else { return };
    let keys = TempDir::new("rp-forge-keys");
    let fleet = keys.path().join("fleet.key");
    write_private(&fleet, b"the fleet's secret, 32 bytes or more, shared by its daemons");
    let (fleet, url) = (fleet.display().to_string(), bg.url());
    let member =
        || Daemon::start_with(&["--remote-cache", &url, "--remote-timeout", "5s", "--remote-cache-key", &fleet]);
    let out = TempDir::new("rp-forge-out");
    let expected = run(&real_nvlink(), &inv(LINK, &out), &[]);
    let a = member();
    same(&expected, &run(&shim(), &inv(LINK, &out), &a.shim_env()));
    wait_uploads(&a, 1);

    let huge = huge_blob(&bg, 64 << 20);
    for action in stored_actions(&bg, "link") {
        forge(&bg, &action, &huge);
    }
    let b = member();
    same(&expected, &run(&shim(), &inv(LINK, &out), &b.shim_env()));
    let s = b.stats();
    assert_eq!(s["cache_hits"].as_u64().zip(s["cache_misses"].as_u64()), Some((0, 1)), "{s}");
    assert!(s["remote_cache_rejected"].as_u64() >= Some(1), "the forged entry was not rejected: {s}");
    assert_eq!(s["remote_cache_errors"].as_u64(), Some(0), "a forgery counted as the server failing: {s}");
    let read = s["remote_cache_bytes_read"].as_u64().unwrap();
    assert!(read < 1 << 20, "{read} bytes read for a forged entry: {s}");
}

/// No daemon writes an entry larger than its upload queue (256 MiB, plus the
/// envelope): an entry naming a larger blob is refused before a byte of it
/// is read, with or without a fleet key.
#[test]
fn an_entry_naming_a_blob_past_257_mib_is_refused_before_any_download() {
    let Some(bg) = BuildGrid::start() else { return };
    let out = TempDir::new("rp-cap-out");
    let expected = run(&real_nvlink(), &inv(LINK, &out), &[]);
    let a = daemon(&bg.url());
    same(&expected, &run(&shim(), &inv(LINK, &out), &a.shim_env()));
    wait_uploads(&a, 1);

    let huge = huge_blob(&bg, (257 << 20) + 1);
    for action in stored_actions(&bg, "link") {
        forge(&bg, &action, &huge);
    }
    let b = daemon(&bg.url());
    same(&expected, &run(&shim(), &inv(LINK, &out), &b.shim_env()));
    let s = b.stats();
    assert_eq!(s["cache_hits"].as_u64().zip(s["cache_misses"].as_u64()), Some((0, 1)), "{s}");
    assert!(s["remote_cache_rejected"].as_u64() >= Some(1), "the entry was not rejected: {s}");
    let read = s["remote_cache_bytes_read"].as_u64().unwrap();
    assert!(read < 1 << 20, "{read} bytes read for an entry past the cap: {s}");
}

/// A fleet key is a secret as long as a token's at least (16 bytes, besides
/// surrounding whitespace): a shorter one is refused at start, naming the file
/// and the rule; one of 16 bytes is taken.
#[test]
fn a_fleet_key_shorter_than_16_bytes_is_refused_at_start() {
    let dir = TempDir::new("rp-short-key");
    let key = dir.path().join("fleet.key");
    // Nothing listens there: the key is read before any connection.
    // A daemon that took the key serves on: `timeout` ends it (124).
    let serve = || {
        std::process::Command::new("timeout")
            .arg("5")
            .arg(nvlinkd())
            .args(["serve", "--socket"])
            .arg(dir.path().join("s.sock"))
            .arg("--cache-dir")
            .arg(dir.path().join("cache"))
            .args(["--remote-cache", "grpc://127.0.0.1:9", "--remote-timeout", "1s", "--remote-cache-key"])
            .arg(&key)
            .output()
            .unwrap()
    };
    for short in [&b"k"[..], b"k\n", b"  fifteen bytes!\n"] {
        write_private(&key, short);
        let out = serve();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && out.status.code() != Some(124), "{short:?}: {out:?}");
        assert!(stderr.contains("fleet.key") && stderr.contains("at least 16"), "{short:?}: {stderr}");
    }
    write_private(&key, b"sixteen bytes!!!\n");
    let out = serve();
    assert_eq!(out.status.code(), Some(124), "a 16-byte key is taken: {out:?}");
}

/// The shared tier's token and the fleet key are secrets: a daemon refuses to
/// start on a file another user can read (they could write entries every
/// daemon of the farm serves), naming the file and the fix, as it does for
/// its own token file; the same file made private is taken.
#[test]
fn a_fleet_key_or_tier_token_others_can_read_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    let dir = TempDir::new("rp-open-key");
    let secret = dir.path().join("secret");
    // Nothing listens there: the files are read before any connection.
    // A daemon that took the file would serve on: `timeout` ends it (124).
    let serve = |option: &str| {
        std::process::Command::new("timeout")
            .arg("20")
            .arg(nvlinkd())
            .args(["serve", "--socket"])
            .arg(dir.path().join("s.sock"))
            .arg("--cache-dir")
            .arg(dir.path().join("cache"))
            .args(["--remote-cache", "grpc://127.0.0.1:9", "--remote-timeout", "1s", option])
            .arg(&secret)
            .output()
            .unwrap()
    };
    for option in ["--remote-cache-key", "--remote-token-file"] {
        std::fs::write(&secret, b"a secret of 32 bytes or more, for the fleet").unwrap();
        std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o644)).unwrap();
        let out = serve(option);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{option}: {out:?}");
        assert!(stderr.contains(option) && stderr.contains("chmod 600"), "{option}: {stderr}");
    }
}
