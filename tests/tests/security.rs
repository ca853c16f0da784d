//! The remote path as an attacker meets it (issue 10): a listener that refuses
//! to serve without TLS and authentication; hostile clients (no token, a wrong
//! token, remote administration, an oversized message); a hostile daemon the
//! shim must not obey (it asks for `/etc/shadow`, writes outside the outputs,
//! returns an exit status nvlink cannot, claims success without the output,
//! stays silent); and a remote link over TLS with a token, byte-identical to
//! the real nvlink. Certificates are made for each test with rcgen.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nvlinkd_proto::paths;
use nvlinkd_proto::v1::{
    client_message, nvlinkd_client::NvlinkdClient, ClientMessage, LinkResult, PingRequest, ShutdownRequest, Start,
    StatsRequest,
};
use nvlinkd_tests::compare;
use nvlinkd_tests::corpus;
use nvlinkd_tests::daemon::Daemon;
use nvlinkd_tests::env::{cuda_home, nvlinkd, real_nvlink, shim, TempDir};
use nvlinkd_tests::remote::{free_port, private_copy, tls_daemon, NobodyDaemon, Pki, OTHER_TOKEN, TOKEN};
use nvlinkd_tests::run::{run, Invocation, Run};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};
use tonic::Code;

const LINK: &str = "--arch=sm_90 accumulate.o scale.o -o {OUT}/out.cubin";
/// A daemon serving `--listen` with TLS and tokens; returns it and its port.
fn secure_daemon(pki: &Pki) -> (Daemon, u16) {
    tls_daemon(pki, &[])
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

async fn tls_channel(pki: &Pki, port: u16) -> Channel {
    let ca = Certificate::from_pem(std::fs::read(pki.file("ca.pem")).unwrap());
    Endpoint::from_shared(format!("https://127.0.0.1:{port}"))
        .unwrap()
        .tls_config(ClientTlsConfig::new().ca_certificate(ca))
        .unwrap()
        .connect()
        .await
        .expect("TLS connection to the daemon")
}

fn with_token<T>(msg: T, token: &str) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    r.metadata_mut().insert("authorization", format!("Bearer {token}").parse().unwrap());
    r
}

/// What `nvlinkd serve` with `extra` printed and how it ended; one still
/// serving after 60 s (it took what it should have refused) is killed.
fn serve_output(extra: &[&str]) -> std::process::Output {
    let dir = TempDir::new("sec-refuse");
    let mut child = Command::new(nvlinkd())
        .arg("serve")
        .arg("--socket")
        .arg(dir.path().join("sock"))
        .arg("--cache-dir")
        .arg(dir.path().join("cache"))
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while child.try_wait().unwrap().is_none() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    child.wait_with_output().unwrap()
}

#[test]
fn listener_refuses_to_start_without_tls_and_authentication() {
    let pki = Pki::new();
    let listen = format!("127.0.0.1:{}", free_port());
    let (cert, key, tokens) = (pki.file("cert.pem"), pki.file("key.pem"), pki.file("tokens"));
    for extra in [
        vec!["--listen", &listen],
        vec!["--listen", &listen, "--tls-cert", &cert, "--tls-key", &key],
        vec!["--listen", &listen, "--token-file", &tokens],
    ] {
        let out = serve_output(&extra);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "nvlinkd served {extra:?}");
        assert!(stderr.contains("refusing to serve --listen"), "{extra:?}: {stderr}");
    }
    pki.replace("empty-tokens", b"# none\n");
    let empty = pki.file("empty-tokens");
    let out = serve_output(&["--listen", &listen, "--tls-cert", &cert, "--tls-key", &key, "--token-file", &empty]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("holds no token"));
}

/// A token shorter than 16 bytes is guessable (or a token cut short): serve
/// refuses the file, naming it and the line, and exits non-zero.
#[test]
fn a_token_shorter_than_16_bytes_is_refused_at_start() {
    let pki = Pki::new();
    let listen = format!("127.0.0.1:{}", free_port());
    let (cert, key) = (pki.file("cert.pem"), pki.file("key.pem"));
    pki.replace("tokens", format!("# farm\nci:{TOKEN}\ndev:short-secret\n").as_bytes());
    let tokens = pki.file("tokens");
    let out = serve_output(&["--listen", &listen, "--tls-cert", &cert, "--tls-key", &key, "--token-file", &tokens]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "nvlinkd served a 12-byte token: {stderr}");
    assert!(stderr.contains(&tokens) && stderr.contains("line 3") && stderr.contains("16 bytes"), "{stderr}");
    assert!(!stderr.contains("short-secret") && !stderr.contains(TOKEN), "a secret shown: {stderr}");
}

/// Like ssh with a private key: a token file other users can read or
/// change is refused at start, saying `chmod 600 FILE`; a symlink to it (as
/// Kubernetes mounts secrets) is judged by the file it leads to.
#[test]
fn a_token_file_others_can_read_is_refused_at_start() {
    use std::os::unix::fs::PermissionsExt;
    let pki = Pki::new();
    let listen = format!("127.0.0.1:{}", free_port());
    let (cert, key, tokens) = (pki.file("cert.pem"), pki.file("key.pem"), pki.file("tokens"));
    let link = pki.file("tokens-link");
    std::os::unix::fs::symlink(&tokens, &link).unwrap();
    for mode in [0o644, 0o640, 0o620] {
        std::fs::set_permissions(&tokens, std::fs::Permissions::from_mode(mode)).unwrap();
        for file in [&tokens, &link] {
            let out =
                serve_output(&["--listen", &listen, "--tls-cert", &cert, "--tls-key", &key, "--token-file", file]);
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(!out.status.success(), "nvlinkd served a token file of mode {mode:o}: {stderr}");
            assert!(stderr.contains(&format!("chmod 600 {file}")), "{mode:o}: {stderr}");
        }
    }
}

/// The listener's private key is a secret as the token file is: a key other
/// users can read or change is refused at start, saying `chmod 600 FILE`.
#[test]
fn a_tls_key_others_can_read_is_refused_at_start() {
    use std::os::unix::fs::PermissionsExt;
    let pki = Pki::new();
    let listen = format!("127.0.0.1:{}", free_port());
    let (cert, key, tokens) = (pki.file("cert.pem"), pki.file("key.pem"), pki.file("tokens"));
    for mode in [0o644, 0o640, 0o604] {
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(mode)).unwrap();
        let out = serve_output(&["--listen", &listen, "--tls-cert", &cert, "--tls-key", &key, "--token-file", &tokens]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "nvlinkd served with a key of mode {mode:o}: {stderr}");
        assert!(stderr.contains("--tls-key") && stderr.contains(&format!("chmod 600 {key}")), "{mode:o}: {stderr}");
    }
}

/// A secret in a directory other users can write (without the sticky bit)
/// could be swapped for theirs between two reads: serve refuses a token file
/// there at start, naming the directory, also through a symlink from a
/// private directory (the directories of the file it leads to are judged);
/// the shim refuses its `NVLINKD_TOKEN_FILE` there before any connection.
#[test]
fn a_token_file_in_a_directory_others_can_write_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    let pki = Pki::new();
    let listen = format!("127.0.0.1:{}", free_port());
    let (cert, key) = (pki.file("cert.pem"), pki.file("key.pem"));
    let open = pki.dir.path().join("open");
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
    let said = format!("{} (mode 777), which other users can write", open.canonicalize().unwrap().display());
    let tokens = open.join("tokens");
    nvlinkd_tests::env::write_private(&tokens, &std::fs::read(pki.file("tokens")).unwrap());
    let link = pki.dir.path().join("tokens-link");
    std::os::unix::fs::symlink(&tokens, &link).unwrap();
    for file in [&tokens, &link] {
        let file = file.display().to_string();
        let out = serve_output(&["--listen", &listen, "--tls-cert", &cert, "--tls-key", &key, "--token-file", &file]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "nvlinkd served a token file in a directory anyone can write: {stderr}");
        assert!(stderr.contains(&file) && stderr.contains(&said), "{stderr}");
    }

    let client_token = open.join("client-token");
    nvlinkd_tests::env::write_private(&client_token, &std::fs::read(pki.file("client-token")).unwrap());
    let out = TempDir::new("sec-open-dir-token");
    let mut env = pki.shim_env(&format!("https://127.0.0.1:{}", free_port()), "never");
    env.iter_mut()
        .filter(|(k, _)| k == paths::ENV_TOKEN_FILE)
        .for_each(|(_, v)| *v = client_token.display().to_string());
    let refused = run(&shim(), &inv(LINK, corpus::dir(), &out), &env);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_ne!(refused.code, 0);
    assert!(stderr.contains(paths::ENV_TOKEN_FILE) && stderr.contains(&said), "{stderr}");
    assert!(refused.files.is_empty(), "output written without an answer");
}

#[test]
fn hostile_clients_are_refused_and_the_daemon_stays_up() {
    let pki = Pki::new();
    let (d, port) = secure_daemon(&pki);
    runtime().block_on(async {
        let channel = tls_channel(&pki, port).await;
        let mut client = NvlinkdClient::new(channel.clone());
        // No token, a wrong token: UNAUTHENTICATED, on every call.
        let e = client.stats(StatsRequest {}).await.unwrap_err();
        assert_eq!(e.code(), Code::Unauthenticated, "{e:?}");
        let e = client.stats(with_token(StatsRequest {}, "wrong")).await.unwrap_err();
        assert_eq!(e.code(), Code::Unauthenticated, "{e:?}");
        let e = client.shutdown(ShutdownRequest {}).await.unwrap_err();
        assert_eq!(e.code(), Code::Unauthenticated, "{e:?}");
        let (tx, rx) = tokio::sync::mpsc::channel::<ClientMessage>(1);
        drop(tx);
        let e = client.link(tokio_stream::wrappers::ReceiverStream::new(rx)).await.unwrap_err();
        assert_eq!(e.code(), Code::Unauthenticated, "{e:?}");

        // Authenticated, but administration is local only; ping tells nothing private.
        let e = client.shutdown(with_token(ShutdownRequest {}, TOKEN)).await.unwrap_err();
        assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
        let ping = client.ping(with_token(PingRequest {}, TOKEN)).await.unwrap().into_inner();
        assert_eq!((ping.pid, ping.cache_dir.as_str()), (0, ""), "remote ping reveals the pid or cache dir");
        let stats = client.stats(with_token(StatsRequest {}, TOKEN)).await.unwrap().into_inner();
        assert!(stats.json.contains("\"auth_failures\":4"), "{}", stats.json);
        assert!(stats.json.contains("\"toolkits\":[]"), "remote stats reveal the toolkits' paths: {}", stats.json);

        // Health, without a token.
        let mut health = tonic_health::pb::health_client::HealthClient::new(channel.clone());
        let h = health.check(tonic_health::pb::HealthCheckRequest { service: String::new() }).await.unwrap();
        assert_eq!(h.into_inner().status, tonic_health::pb::health_check_response::ServingStatus::Serving as i32);

        // A message far over the bound (the daemon must refuse it, not allocate it).
        let mut big = NvlinkdClient::new(channel.clone()).max_encoding_message_size(usize::MAX);
        let start = Start { args: vec!["x".repeat(64 << 20)], ..Default::default() };
        let (tx, rx) = tokio::sync::mpsc::channel::<ClientMessage>(1);
        tx.send(ClientMessage { msg: Some(client_message::Msg::Start(start)) }).await.unwrap();
        let refused = match big.link(with_token(tokio_stream::wrappers::ReceiverStream::new(rx), TOKEN)).await {
            Err(e) => Some(e),
            Ok(r) => r.into_inner().message().await.err(),
        };
        drop(tx);
        let e = refused.expect("a 64 MiB message was accepted");
        assert!(matches!(e.code(), Code::OutOfRange | Code::ResourceExhausted | Code::Internal), "{e:?}");

        // Within the bound, but two million empty announced files: over 100 MiB
        // decoded. Refused before it is decoded.
        let files = vec![nvlinkd_proto::v1::AnnouncedFile::default(); 2_000_000];
        let start = Start { args: vec!["--arch=sm_90".into()], files, ..Default::default() };
        let (tx, rx) = tokio::sync::mpsc::channel::<ClientMessage>(1);
        tx.send(ClientMessage { msg: Some(client_message::Msg::Start(start)) }).await.unwrap();
        let refused = match client.link(with_token(tokio_stream::wrappers::ReceiverStream::new(rx), TOKEN)).await {
            Err(e) => Some(e),
            Ok(r) => r.into_inner().message().await.err(),
        };
        drop(tx);
        let e = refused.expect("a Start of two million files was taken");
        assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
        assert!(e.message().contains("decoded"), "{e:?}");

        // Compressed requests are never taken (a few bytes that decompress
        // to megabytes): the shim sends none.
        let mut zstd = NvlinkdClient::new(channel.clone()).send_compressed(tonic::codec::CompressionEncoding::Zstd);
        let e = zstd.stats(with_token(StatsRequest {}, TOKEN)).await.unwrap_err();
        assert_eq!(e.code(), Code::Unimplemented, "a compressed request was taken: {e:?}");
    });
    assert!(d.answers(), "the daemon died");
    assert_eq!(d.stat("auth_failures"), 4);
    // The unix socket still administers.
    assert!(d.control("status").is_some_and(|(ok, _)| ok));
}

fn inv(args: &str, cwd: &Path, out: &TempDir) -> Invocation {
    Invocation::templated(args, cwd, out)
}

fn remote_env(pki: &Pki, addr: &str) -> Vec<(String, String)> {
    pki.shim_env(addr, "never")
}

#[test]
fn remote_link_over_tls_with_a_token_matches_nvlink() {
    let pki = Pki::new();
    let (d, port) = secure_daemon(&pki);
    let out = TempDir::new("sec-tls-out");
    let expected = run(&real_nvlink(), &inv(LINK, corpus::dir(), &out), &[]);
    // The first address answers nothing: the shim fails over to the second.
    let addr = format!("https://127.0.0.1:{},https://127.0.0.1:{port}", free_port());
    let actual = run(&shim(), &inv(LINK, corpus::dir(), &out), &remote_env(&pki, &addr));
    let cmp = compare::runs(&expected, &actual);
    assert!(cmp.problems.is_empty() && cmp.identical, "{:?}", cmp.problems);
    assert_eq!(d.stat("requests"), 1, "the daemon did not serve the link");
    assert_eq!(d.stat("fallbacks"), 0);
    // The two inputs, and nothing the link does not read (the toolkit's libcudadevrt).
    let inputs: u64 = ["accumulate.o", "scale.o"].iter().map(|f| corpus::dir().join(f).metadata().unwrap().len()).sum();
    assert_eq!(d.stat("input_bytes_received"), inputs);
    // Without the token the shim is refused and (never falling back) fails.
    let mut env = remote_env(&pki, &format!("https://127.0.0.1:{port}"));
    env.retain(|(k, _)| k != paths::ENV_TOKEN_FILE);
    let refused = run(&shim(), &inv(LINK, corpus::dir(), &out), &env);
    assert_ne!(refused.code, 0);
    assert!(refused.files.is_empty(), "output written without a daemon's answer");
    assert_eq!(d.stat("auth_failures"), 1);
}

/// The local socket serves the daemon's own user and root, whatever its mode:
/// opened up to everyone (as an operator might, by mistake or on purpose),
/// another user's `stats`, `events`, `stop` and links are refused, counted,
/// and the daemon goes on serving its own user.
#[test]
fn another_user_on_an_opened_local_socket_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: needs root to act as another user");
        return;
    }
    let d = Daemon::start();
    let sock = d.socket();
    std::fs::set_permissions(sock.parent().unwrap(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o777)).unwrap();
    let as_nobody = |args: &[&str], env: &[(String, String)]| {
        // `timeout`: an events stream the daemon accepted would never end.
        Command::new("timeout")
            .args(["20", "setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "--"])
            .args(args)
            .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .current_dir(corpus::dir())
            .output()
    };
    let nvlinkd = nvlinkd().display().to_string();
    let socket = sock.display().to_string();
    match as_nobody(&[&nvlinkd, "--version"], &[]) {
        Ok(o) if o.status.success() => {}
        other => {
            eprintln!("skipped: nobody cannot run nvlinkd here ({other:?})");
            return;
        }
    }
    for what in ["stats", "events", "stop"] {
        let o = as_nobody(&[&nvlinkd, what, "--socket", &socket], &[]).unwrap();
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{what} as nobody: {o:?}");
        assert!(stderr.contains("this daemon serves uid 0"), "{what} as nobody: {stderr}");
    }
    let out = TempDir::new("sec-nobody-out");
    std::fs::set_permissions(out.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let mut env = d.shim_env();
    env.push((paths::ENV_FALLBACK.into(), "never".into()));
    let args = inv(LINK, corpus::dir(), &out).args;
    let shim_path = shim().display().to_string();
    let mut cmd: Vec<&str> = vec![&shim_path];
    cmd.extend(args.iter().map(String::as_str));
    let link = as_nobody(&cmd, &env).unwrap();
    assert!(!link.status.success(), "a link as nobody: {link:?}");
    assert_eq!(d.stat("requests"), 0, "{}", d.stats());
    assert!(d.stat("auth_failures") >= 4, "{}", d.stats());
    // Still the daemon of its own user.
    let mine = run(&real_nvlink(), &inv(LINK, corpus::dir(), &out), &[]);
    let theirs = run(&shim(), &inv(LINK, corpus::dir(), &out), &d.shim_env());
    assert!(compare::runs(&mine, &theirs).identical);
}

/// The shim reads its token only from a file no other user can read (another
/// user could link on the farm as this one): an open file is refused before
/// any connection, with the fix named; with `NVLINKD_FALLBACK=auto` the link is
/// nvlink's own, and the daemon never saw the token.
#[test]
fn a_token_file_other_users_can_read_is_refused_by_the_shim() {
    use std::os::unix::fs::PermissionsExt;
    let pki = Pki::new();
    let (d, port) = secure_daemon(&pki);
    let out = TempDir::new("sec-open-token");
    let expected = run(&real_nvlink(), &inv(LINK, corpus::dir(), &out), &[]);
    let open = pki.file("open-token");
    pki.replace("open-token", format!("{}\n", nvlinkd_tests::remote::TOKEN).as_bytes());
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o644)).unwrap();
    let env = |fallback: &str| {
        let mut env = pki.shim_env(&format!("https://127.0.0.1:{port}"), fallback);
        env.iter_mut().filter(|(k, _)| k == paths::ENV_TOKEN_FILE).for_each(|(_, v)| *v = open.clone());
        env
    };
    let refused = run(&shim(), &inv(LINK, corpus::dir(), &out), &env("never"));
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_ne!(refused.code, 0);
    assert!(stderr.contains("can be read or changed by other users") && stderr.contains("chmod 600"), "{stderr}");
    assert!(refused.files.is_empty(), "output written without an answer");
    let fell_back = run(&shim(), &inv(LINK, corpus::dir(), &out), &env("auto"));
    assert_eq!(fell_back.files, expected.files, "not nvlink's output");
    assert_eq!((d.stat("requests"), d.stat("auth_failures")), (0, 0), "{}", d.stats());
}

/// A hostile daemon (tests/src/bin/nvlinkd-hostile.rs) in `mode`, killed on drop.
struct HostileDaemon {
    child: std::process::Child,
    port: u16,
}

impl HostileDaemon {
    fn start(mode: &str, path: &Path) -> HostileDaemon {
        use std::io::BufRead;
        let mut child = Command::new(env!("CARGO_BIN_EXE_nvlinkd-hostile"))
            .arg(mode)
            .arg(path)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        HostileDaemon { child, port: line.trim().parse().expect("the hostile daemon's port") }
    }
}

impl Drop for HostileDaemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn the_shim_obeys_no_hostile_daemon() {
    let out = TempDir::new("sec-hostile-out");
    let inputs = TempDir::new("sec-hostile-in");
    for f in ["accumulate.o", "scale.o"] {
        std::fs::copy(corpus::dir().join(f), inputs.path().join(f)).unwrap();
    }
    let expected: Run = run(&real_nvlink(), &inv(LINK, inputs.path(), &out), &[]);
    assert_eq!(expected.code, 0);
    let absolute = TempDir::new("sec-hostile-abs");
    let planted = absolute.path().join("planted");
    let escaped = out.path().parent().unwrap().join("out.cubin");
    for mode in ["read-secret", "write-parent", "write-absolute", "exit-256", "exit-0-no-output", "stage", "silent"] {
        let hostile = HostileDaemon::start(mode, &planted);
        let env = |fallback: &str| {
            vec![
                (paths::ENV_ADDR.to_string(), format!("http://127.0.0.1:{}", hostile.port)),
                (paths::ENV_FALLBACK.into(), fallback.into()),
                (paths::ENV_REAL_NVLINK.into(), real_nvlink().display().to_string()),
                // A silent daemon is given up after this long.
                (paths::ENV_TIMEOUT.into(), "2".into()),
            ]
        };
        // Falling back: nvlink's own result, and a word on stderr for a violation.
        let actual = run(&shim(), &inv(LINK, inputs.path(), &out), &env("auto"));
        assert_eq!(actual.code, expected.code, "{mode}: {}", String::from_utf8_lossy(&actual.stderr));
        assert_eq!(actual.files, expected.files, "{mode}: the outputs are not nvlink's");
        assert_eq!(actual.stdout, expected.stdout, "{mode}");
        if mode != "silent" {
            let stderr = String::from_utf8_lossy(&actual.stderr);
            assert!(stderr.contains("nvlinkd protocol violation"), "{mode}: {stderr}");
        }
        // Never falling back: a failure, and nothing written.
        let failed = run(&shim(), &inv(LINK, inputs.path(), &out), &env("never"));
        assert_ne!(failed.code, 0, "{mode}: the shim took the hostile daemon's answer");
        assert!(failed.files.is_empty(), "{mode}: {:?}", failed.files.keys());
        assert!(!planted.exists(), "{mode}: the shim wrote an absolute path the daemon named");
        assert!(!escaped.exists(), "{mode}: the shim wrote outside its outputs");
    }
}

/// A large output is written to disk as it arrives: the shim's memory stays
/// bounded (it held the whole output, 2 GB for a 1.5 GiB one; what it holds
/// now is its spill threshold plus its receive window, whatever the output's
/// size, well under 64 MiB), the file is complete, and nothing is left beside it.
#[test]
fn a_large_output_streams_to_disk_in_bounded_memory() {
    let out = TempDir::new("sec-big-out");
    let inputs = TempDir::new("sec-big-in");
    for f in ["accumulate.o", "scale.o"] {
        std::fs::copy(corpus::dir().join(f), inputs.path().join(f)).unwrap();
    }
    let mib = 256;
    let hostile = HostileDaemon::start("big-output", Path::new(&mib.to_string()));
    let link = inv(LINK, inputs.path(), &out);
    let mut cmd = Command::new(shim());
    cmd.args(&link.args)
        .current_dir(&link.cwd)
        .env_clear()
        .env(paths::ENV_ADDR, format!("http://127.0.0.1:{}", hostile.port))
        .env(paths::ENV_FALLBACK, "never")
        .env(paths::ENV_REAL_NVLINK, real_nvlink());
    #[allow(clippy::zombie_processes)] // reaped by wait4 below, which also gives its rusage
    let child = cmd.spawn().unwrap();
    // The shim's own peak memory, from wait4.
    let mut status = 0;
    // SAFETY: rusage is plain data, zeroed is a valid value.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: waits for our own child, with valid pointers.
    let pid = unsafe { libc::wait4(child.id() as i32, &mut status, 0, &mut usage) };
    assert_eq!(pid, child.id() as i32);
    assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "shim status {status}");
    let peak_mib = usage.ru_maxrss / 1024;
    eprintln!("shim peak: {peak_mib} MiB for a {mib} MiB output");
    assert!(peak_mib < 64, "the shim held {peak_mib} MiB for a {mib} MiB output");
    let written = std::fs::read(out.path().join("out.cubin")).unwrap();
    assert_eq!(written.len(), mib << 20);
    assert!(written.chunks(1 << 20).enumerate().all(|(i, c)| c.iter().all(|b| *b == (i % 251) as u8)));
    let left: Vec<_> = std::fs::read_dir(out.path()).unwrap().flatten().map(|e| e.file_name()).collect();
    assert_eq!(left.len(), 1, "files left beside the output: {left:?}");
}

/// The daemon as another user that cannot read the inputs: a remote link must
/// come entirely through the shim (skipped where the machine refuses).
#[test]
fn remote_daemon_as_another_user_reads_nothing_of_the_callers() {
    let pki = Pki::new();
    let Some(daemon) = NobodyDaemon::start(&pki) else { return };
    let inputs = private_copy(corpus::dir(), "sec-nobody-in");
    let out = TempDir::new("sec-nobody-out");
    let expected = run(&real_nvlink(), &inv(LINK, inputs.path(), &out), &[]);
    let actual = run(&shim(), &inv(LINK, inputs.path(), &out), &remote_env(&pki, &daemon.addr()));
    let cmp = compare::runs(&expected, &actual);
    assert!(cmp.problems.is_empty() && cmp.identical, "{:?}", cmp.problems);
}

/// `-time` rows with their times masked (they differ from run to run).
fn mask_time_rows(text: &[u8]) -> String {
    let text = String::from_utf8_lossy(text);
    let rows = text.lines().map(|l| match l.rsplit_once(" , ms").and_then(|(head, _)| head.rsplit_once(" , ")) {
        Some((cells, _)) => format!("{cells} , <time> , ms"),
        None => l.to_owned(),
    });
    rows.collect::<Vec<_>>().join("\n")
}

/// Links the in-process engine declines run, for a remote caller, on the
/// daemon's own nvlink in a sandbox holding the link's files under the
/// caller's names: absolute names in messages, in the output's tool entry
/// (`-L`, `-nvvmpath`) and in `-time` rows (appended to the caller's file) are
/// the caller's, byte for byte. A name that climbs above the caller's root is
/// not mirrored (the link falls back), and no sandbox outlives its link.
#[test]
fn remote_routed_links_run_in_a_sandbox_under_the_callers_names() {
    let pki = Pki::new();
    let Some(daemon) = NobodyDaemon::start(&pki) else { return };
    let inputs = private_copy(corpus::dir(), "sec-sandbox-in");
    let dir = inputs.path().display().to_string();
    let time = inputs.path().join("time.csv");
    let out = TempDir::new("sec-sandbox-out");
    let up = "../".repeat(inputs.path().components().count() + 2);
    let cases = [
        // Undefined reference in an absolute name (routed: link errors with --register-link-binaries).
        (format!("--arch=sm_90 --register-link-binaries={{OUT}}/reg.c {dir}/missing.o -o {{OUT}}/out.cubin"), true),
        // Partial LTO (with --keep-system-libraries: routed): nvlink records -L and -nvvmpath in its tool entry.
        (format!("--arch=sm_90 -dlto --keep-system-libraries -nvvmpath={{NVVM}} -L{{L}} -L{dir}/lib {dir}/cdp_lto.o -lcudadevrt -o {{OUT}}/out.cubin"), true),
        // -time rows naming absolute inputs, appended to the caller's file
        // (routed for -v; -time alone is answered in process).
        (format!("--arch=sm_90 -v -time {dir}/time.csv {dir}/saxpy_ptx.o -o {{OUT}}/out.cubin"), true),
        // Above the root and down again: the same file for nvlink, not mirrored.
        (format!("--arch=sm_90 -v {up}{}/accumulate.o scale.o -o {{OUT}}/out.cubin", &dir[1..]), false),
        // A list of directories (not moved one by one) and a path for the embedded ptxas.
        (format!("--arch=sm_90 -v -L{dir}/lib,{dir}/tinylib accumulate.o scale.o -o {{OUT}}/out.cubin"), false),
        (format!("--arch=sm_90 -v -Xptxas --output-file={dir}/x.o accumulate.o scale.o -o {{OUT}}/out.cubin"), false),
    ];
    for (args, sandboxed) in &cases {
        let before = daemon.stats();
        std::fs::write(&time, "earlier rows\n").unwrap();
        let expected = run(&real_nvlink(), &inv(args, inputs.path(), &out), &[]);
        let expected_time = mask_time_rows(&std::fs::read(&time).unwrap());
        std::fs::write(&time, "earlier rows\n").unwrap();
        let actual = run(&shim(), &inv(args, inputs.path(), &out), &pki.shim_env(&daemon.addr(), "auto"));
        let actual_time = mask_time_rows(&std::fs::read(&time).unwrap());
        let cmp = compare::runs(&expected, &actual);
        assert!(cmp.problems.is_empty() && cmp.identical, "{args}: {:?}", cmp.problems);
        assert_eq!(expected_time, actual_time, "{args}: -time file");
        assert!(!args.contains("-time") || actual_time.lines().count() > 1, "no -time rows compared");
        let after = daemon.stats();
        let grew = |k: &str| after[k].as_u64().unwrap_or(0) - before[k].as_u64().unwrap_or(0);
        if *sandboxed {
            assert!(expected.code != 0 || !expected.files.is_empty(), "{args}: nothing to compare");
            assert_eq!(
                (grew("nvlink_process"), grew("fallbacks")),
                (1, 0),
                "{args}: not served by the daemon's nvlink"
            );
        } else {
            assert_eq!((grew("nvlink_process"), grew("fallbacks")), (0, 1), "{args}: mirrored out of the root");
        }
    }
    let left: Vec<_> =
        std::fs::read_dir(daemon.cache_dir().join("tmp")).unwrap().flatten().map(|e| e.file_name()).collect();
    assert!(left.is_empty(), "sandboxes left behind: {left:?}");
}

/// A routed remote link with `--register-link-binaries` and a device-only
/// input (a `.cubin`, a `.ptx`): nvlink names such an input in the
/// registration file by its absolute path, mangled (`_w_p_scale_cubin`).
/// The daemon's nvlink ran on the sandbox's copy, yet the file names the
/// caller's path, byte for byte, and so does the entry a later local link of
/// the same directory and arguments is served from; no answer names the
/// sandbox, the daemon's cache directory or its pid.
#[test]
fn a_routed_remote_registration_file_names_the_callers_paths() {
    let pki = Pki::new();
    let (d, port) = secure_daemon(&pki);
    let inputs = private_copy(corpus::dir(), "sec-regbin-in");
    let out = TempDir::new("sec-regbin-out");
    let remote = remote_env(&pki, &format!("https://127.0.0.1:{port}"));
    let cases = [
        // Routed for -v.
        "--arch=sm_90 -v --register-link-binaries={OUT}/reg.c accumulate.o scale.cubin -o {OUT}/out.cubin",
        // Routed for -split-compile with PTX.
        "--arch=sm_90 -split-compile=4 --register-link-binaries={OUT}/reg.c accumulate.o saxpy.ptx -o {OUT}/out.cubin",
    ];
    let cache = d.cache_dir().display().to_string();
    let pid = d.pid().unwrap().to_string();
    for args in cases {
        let before = d.stats();
        let expected = run(&real_nvlink(), &inv(args, inputs.path(), &out), &[]);
        assert!(expected.files.get("reg.c").is_some_and(|r| !r.is_empty()), "{args}: no reg.c to compare");
        let actual = run(&shim(), &inv(args, inputs.path(), &out), &remote);
        let cmp = compare::runs(&expected, &actual);
        assert!(cmp.problems.is_empty() && cmp.identical, "{args}: remote: {:?}", cmp.problems);
        let after = d.stats();
        let grew = |k: &str| after[k].as_u64().unwrap_or(0) - before[k].as_u64().unwrap_or(0);
        assert_eq!((grew("nvlink_process"), grew("fallbacks")), (1, 0), "{args}: not served by the daemon's nvlink");
        // The same directory and arguments, locally: the cached answer.
        let local = run(&shim(), &inv(args, inputs.path(), &out), &d.shim_env());
        let cmp = compare::runs(&expected, &local);
        assert!(cmp.problems.is_empty() && cmp.identical, "{args}: local: {:?}", cmp.problems);
        for r in [&actual, &local] {
            let texts = [&r.stdout, &r.stderr].into_iter().chain(r.files.values());
            for t in texts {
                let t = String::from_utf8_lossy(t);
                let mangled = cache.replace(|c: char| !c.is_ascii_alphanumeric(), "_");
                assert!(!t.contains(&cache) && !t.contains(&mangled), "{args}: an answer names the daemon's cache");
                let scratch = [format!("nvlinkd-{pid}-"), format!("nvlinkd_{pid}_")];
                assert!(!scratch.iter().any(|s| t.contains(s)), "{args}: an answer names the daemon's pid");
            }
        }
    }
}

/// One archive named twice through two names of one file (a hard link, a
/// symlink, `-L` through a symlinked directory): nvlink takes it once and
/// links. A remote link gives nvlink's answer too (the remote shim runs the
/// real nvlink for it: the daemon has names, not files, and its sandbox
/// would hold two archives); two copies of the archive stay two files, served
/// by the daemon, and give nvlink's "Multiple definition" answer.
#[test]
fn one_archive_under_two_names_links_once_for_a_remote_caller() {
    let pki = Pki::new();
    let (d, port) = secure_daemon(&pki);
    let inputs = private_copy(corpus::dir(), "sec-alias-in");
    let dir = inputs.path();
    let ar = Command::new("ar").arg("rcs").arg("libacc.a").args(["accumulate.o", "scale.o"]).current_dir(dir).status();
    assert!(ar.is_ok_and(|s| s.success()), "ar failed");
    std::fs::hard_link(dir.join("libacc.a"), dir.join("hard_libacc.a")).unwrap();
    std::os::unix::fs::symlink("libacc.a", dir.join("sym_libacc.a")).unwrap();
    std::fs::copy(dir.join("libacc.a"), dir.join("copy_libacc.a")).unwrap();
    std::fs::create_dir(dir.join("sub")).unwrap();
    std::os::unix::fs::symlink("../libacc.a", dir.join("sub/libacc.a")).unwrap();
    std::os::unix::fs::symlink(".", dir.join("here")).unwrap();
    let out = TempDir::new("sec-alias-out");
    let remote = pki.shim_env(&format!("https://127.0.0.1:{port}"), "auto");
    let cases = [
        ("--arch=sm_90 libacc.a hard_libacc.a -o {OUT}/out.cubin", 0),
        ("--arch=sm_90 libacc.a sym_libacc.a -o {OUT}/out.cubin", 0),
        ("--arch=sm_90 -Lsub -lacc libacc.a -o {OUT}/out.cubin", 0),
        ("--arch=sm_90 -Lhere -lacc libacc.a -o {OUT}/out.cubin", 0),
        ("--arch=sm_90 libacc.a copy_libacc.a -o {OUT}/out.cubin", 1),
    ];
    for (args, served) in cases {
        let before = d.stat_or_zero("requests");
        let expected = run(&real_nvlink(), &inv(args, dir, &out), &[]);
        let actual = run(&shim(), &inv(args, dir, &out), &remote);
        let cmp = compare::runs(&expected, &actual);
        assert!(cmp.problems.is_empty() && cmp.identical, "{args}: {:?}", cmp.problems);
        assert_eq!(d.stat_or_zero("requests") - before, served, "{args}: served by the daemon");
    }
}

/// nvlink finds relative names through its process's working directory,
/// not through the directory's name. The owner of a directory above a build
/// directory may swap the build directory for its own under the same name
/// while a link runs: the daemon opens the caller's directory once (checked
/// to be the shim's) and reads the link's files through it, and the shim
/// writes relative outputs through its own working directory. The link is
/// the one of the directory it started in, its output lands there, and
/// nothing lands in the other.
#[test]
fn a_build_directory_swapped_during_a_local_link_is_not_followed() {
    let d = Daemon::start_env(&[], &[("NVLINKD_TEST_SLOW_LINK_MS", "1500")]);
    let top = TempDir::new("sec-swap");
    let [build, other, moved] = ["build", "other", "moved"].map(|n| top.path().join(n));
    for dir in [&build, &other] {
        std::fs::create_dir(dir).unwrap();
        std::fs::copy(corpus::dir().join("scale.o"), dir.join("scale.o")).unwrap();
    }
    std::fs::copy(corpus::dir().join("accumulate.o"), build.join("accumulate.o")).unwrap();
    std::fs::copy(corpus::dir().join("saxpy.o"), other.join("accumulate.o")).unwrap();
    let args = ["--arch=sm_90", "accumulate.o", "scale.o", "-o", "out.cubin"];
    let real = Command::new(real_nvlink()).args(args).current_dir(&build).status().unwrap();
    assert!(real.success());
    let expected = std::fs::read(build.join("out.cubin")).unwrap();
    std::fs::remove_file(build.join("out.cubin")).unwrap();
    let (cwd, env) = (build.clone(), d.shim_env());
    let link = std::thread::spawn(move || Command::new(shim()).args(args).current_dir(cwd).envs(env).output().unwrap());
    // The link has started (its directory opened) and waits: swap.
    d.wait_stat("in_flight", 1);
    std::fs::rename(&build, &moved).unwrap();
    std::fs::rename(&other, &build).unwrap();
    let out = link.join().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(!build.join("out.cubin").exists(), "the output was written into the other directory");
    let got = std::fs::read(moved.join("out.cubin")).expect("no output in the link's own directory");
    assert!(got == expected, "the link read the other directory's files");
}

/// Open a `Stats` call over raw HTTP/2 on the unix socket and send only a gRPC
/// frame header announcing a 1 GiB message; returns the grpc-status the daemon
/// answers with (the stream is kept open: no body follows).
async fn announce_one_gib(socket: &Path) -> Option<String> {
    let io = tokio::net::UnixStream::connect(socket).await.ok()?;
    let (mut h2, conn) = h2::client::handshake(io).await.ok()?;
    tokio::spawn(conn);
    let req = http::Request::post("http://nvlinkd.local/nvlinkd.v1.Nvlinkd/Stats")
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .unwrap();
    let (response, mut body) = h2.send_request(req, false).ok()?;
    // Compressed flag 0, length 2^30, and nothing more.
    body.send_data(bytes::Bytes::from_static(&[0, 0x40, 0, 0, 0]), false).ok()?;
    let status = grpc_status(response, Duration::from_secs(60)).await;
    drop(body);
    status
}

/// The grpc-status a raw HTTP/2 call ends with (in its response's headers,
/// or its trailers), if it ends within `wait`.
async fn grpc_status(response: h2::client::ResponseFuture, wait: Duration) -> Option<String> {
    let status = |h: &http::HeaderMap| h.get("grpc-status").and_then(|v| v.to_str().ok()).map(str::to_owned);
    tokio::time::timeout(wait, async {
        let response = response.await.ok()?;
        if let Some(s) = status(response.headers()) {
            return Some(s);
        }
        let mut recv = response.into_body();
        while let Some(Ok(_)) = recv.data().await {}
        status(&recv.trailers().await.ok()??)
    })
    .await
    .ok()
    .flatten()
}

#[test]
fn a_header_announcing_one_gib_is_refused_without_allocating_it() {
    // A daemon that reserved what such headers announce would die at this limit.
    let d = Daemon::start_limited(&[], 4 << 30);
    let socket = d.socket();
    let statuses = runtime().block_on(async {
        let calls: Vec<_> = (0..10).map(|_| tokio::spawn(announce_one_gib_owned(socket.clone()))).collect();
        let mut statuses = Vec::new();
        for c in calls {
            statuses.push(c.await.unwrap());
        }
        statuses
    });
    // RESOURCE_EXHAUSTED (8) or OUT_OF_RANGE (11): refused, not waited for.
    for s in &statuses {
        assert!(matches!(s.as_deref(), Some("8") | Some("11")), "{statuses:?}");
    }
    assert!(d.answers(), "the daemon died");
    let peak_kib = vm_kib(d.pid().unwrap(), "VmHWM:");
    assert!(peak_kib < 512 << 10, "the daemon peaked at {peak_kib} KiB");
}

async fn announce_one_gib_owned(socket: std::path::PathBuf) -> Option<String> {
    announce_one_gib(&socket).await
}

/// A `Link` call over plain TCP (`--insecure`, with a token) that sends a
/// gRPC prefix announcing a message of 4 MiB and all of it but the last 64
/// bytes, then stalls; the grpc-status it ends with, if it ends within
/// `wait`.
async fn stall_a_message(h2: &mut h2::client::SendRequest<bytes::Bytes>, wait: Duration) -> Option<String> {
    let req = http::Request::post("http://nvlinkd.remote/nvlinkd.v1.Nvlinkd/Link")
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .header("authorization", format!("Bearer {TOKEN}"))
        .body(())
        .unwrap();
    let (response, mut body) = h2.clone().ready().await.ok()?.send_request(req, false).ok()?;
    let len = (nvlinkd_proto::MAX_MESSAGE_BYTES - 16) as u32;
    let mut prefix = vec![0u8];
    prefix.extend(len.to_be_bytes());
    body.send_data(prefix.into(), false).ok()?;
    body.send_data(vec![0x0a; len as usize - 48].into(), false).ok()?;
    let ended = grpc_status(response, wait).await;
    // Kept open while stalled: the daemon holds what it received.
    std::mem::forget(body);
    ended
}

fn vm_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// A token holder's streams that each send a 4 MiB message less 64 bytes and
/// stall: the daemon holds at most its budget of messages received in part
/// (`--jobs 1`: four links' worth, two of them for one address), ends the
/// streams past it with RESOURCE_EXHAUSTED, and does not grow by what 128
/// streams sent (512 MiB); a local link is answered meanwhile.
#[test]
fn messages_received_in_part_hold_a_bounded_budget() {
    let pki = Pki::new();
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let tokens = pki.file("tokens");
    let d = Daemon::start_with(&["--listen", &listen, "--insecure", "--token-file", &tokens, "--jobs", "1"]);
    let pid = d.pid().unwrap();
    let before = vm_kib(pid, "VmRSS:");
    let statuses = runtime().block_on(async {
        let mut connections = Vec::new();
        for _ in 0..8 {
            let io = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.unwrap();
            let (h2, conn) = h2::client::handshake(io).await.unwrap();
            tokio::spawn(conn);
            connections.push(h2);
        }
        let mut calls = Vec::new();
        for h2 in &connections {
            for _ in 0..16 {
                let mut h2 = h2.clone();
                calls.push(tokio::spawn(async move { stall_a_message(&mut h2, Duration::from_secs(20)).await }));
            }
        }
        let mut statuses = Vec::new();
        for c in calls {
            statuses.push(c.await.unwrap());
        }
        (statuses, connections)
    });
    let (statuses, _connections) = statuses;
    let refused = statuses.iter().filter(|s| s.as_deref() == Some("8")).count();
    let grew_mib = vm_kib(pid, "VmHWM:").saturating_sub(before) >> 10;
    let stats = d.stats();
    assert!(refused >= 100, "{refused} of 128 stalled streams refused: {statuses:?}");
    assert!(d.stat("partial_messages_refused") >= refused as u64, "{stats}");
    assert!(d.stat("partial_message_bytes") <= 16 << 20, "past one address's half: {stats}");
    assert!(grew_mib < 200, "the daemon grew by {grew_mib} MiB");
    let out = TempDir::new("sec-partial-out");
    let local = run(&shim(), &inv(LINK, corpus::dir(), &out), &d.shim_env());
    assert_eq!(local.code, 0, "a local link failed: {}", String::from_utf8_lossy(&local.stderr));
}

/// The health service needs no token: a health call announcing a 4 MiB
/// message is refused at its prefix and holds nothing of the budget of
/// messages received in part (which callers without a token would
/// otherwise fill for everyone).
#[test]
fn a_health_call_without_a_token_holds_no_budget() {
    let pki = Pki::new();
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let tokens = pki.file("tokens");
    let d = Daemon::start_with(&["--listen", &listen, "--insecure", "--token-file", &tokens, "--jobs", "1"]);
    let status = runtime().block_on(async {
        let io = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        let (h2, conn) = h2::client::handshake(io).await.unwrap();
        tokio::spawn(conn);
        let req = http::Request::post("http://nvlinkd.remote/grpc.health.v1.Health/Check")
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .body(())
            .unwrap();
        let (response, mut body) = h2.ready().await.unwrap().send_request(req, false).unwrap();
        body.send_data(bytes::Bytes::from_static(&[0, 0, 0x40, 0, 0]), false).unwrap();
        let _ = body.send_data(vec![0x0a; 1 << 20].into(), false);
        let ended = grpc_status(response, Duration::from_secs(10)).await;
        std::mem::forget(body);
        ended
    });
    assert!(matches!(status.as_deref(), Some("8") | Some("11")), "a 4 MiB health message was waited for: {status:?}");
    assert_eq!(d.stat("partial_message_bytes"), 0, "{}", d.stats());
}

/// The poisoning attempt of issue 10 (a client that announces nothing: its
/// files are asked for by path): it answers the first stat of each path
/// truthfully and "missing" to every later one, handing over the archive when
/// it is read. The key sees the library (its first stat) and a link that
/// stat'ed it again would not: its answer (undefined references) would land
/// under the key of a link with the library. `MemoFs`'s one view per link
/// closes this (removing its stat memo makes this test fail). Whatever the
/// daemon makes of it, later genuine links from the same directory, with the
/// library and without it, must get nvlink's own answers.
#[test]
fn a_client_cannot_store_a_result_under_another_links_key() {
    use nvlinkd_proto::v1::{file_reply, file_request, server_message, FileError, FileReply, FileStat, ServerMessage};
    let d = Daemon::start();
    // The victim's directory: the object and lib/libdevmath.a.
    let victim = TempDir::new("sec-poison-victim");
    std::fs::copy(corpus::dir().join("mathlib_main.o"), victim.path().join("mathlib_main.o")).unwrap();
    std::fs::create_dir(victim.path().join("lib")).unwrap();
    std::fs::copy(corpus::dir().join("lib/libdevmath.a"), victim.path().join("lib/libdevmath.a")).unwrap();
    let out = TempDir::new("sec-poison-out");
    let case = "--arch=sm_90 mathlib_main.o -Llib -ldevmath -o {OUT}/out.cubin";
    let invocation = inv(case, victim.path(), &out);

    let served = runtime().block_on(async {
        let channel =
            nvlinkd_proto::shared::connect_unix(nvlinkd_proto::shared::unix_endpoint(), d.socket()).await.unwrap();
        let mut client = NvlinkdClient::new(channel);
        let start = Start {
            args: invocation.args.clone(),
            cwd: victim.path().display().to_string(),
            // Not the daemon's view of the directory: the files come over the stream.
            cwd_dev: 0,
            cwd_ino: 0,
            ..Default::default()
        };
        let (tx, rx) = tokio::sync::mpsc::channel::<ClientMessage>(64);
        tx.send(ClientMessage { msg: Some(client_message::Msg::Start(start)) }).await.unwrap();
        let mut inbound = client.link(tokio_stream::wrappers::ReceiverStream::new(rx)).await.unwrap().into_inner();
        let mut requests = 0;
        let mut stated: std::collections::HashSet<String> = std::collections::HashSet::new();
        while let Ok(Some(ServerMessage { msg: Some(m) })) = inbound.message().await {
            let server_message::Msg::File(req) = m else { continue };
            requests += 1;
            let path = Path::new(&req.path);
            let real = path.to_path_buf();
            let result = match req.op() {
                file_request::Op::Stat if path.ends_with("mathlib_main.o") || stated.insert(req.path.clone()) => {
                    match std::fs::metadata(&real) {
                        Ok(m) => file_reply::Result::Stat(FileStat { is_dir: m.is_dir(), size: m.len() }),
                        Err(e) => file_reply::Result::Error(FileError { kind: 0, message: e.to_string() }),
                    }
                }
                file_request::Op::Stat => {
                    file_reply::Result::Error(FileError { kind: 0, message: "No such file or directory".into() })
                }
                file_request::Op::Read => match std::fs::read(&real) {
                    Ok(data) => file_reply::Result::Data(data.into()),
                    Err(e) => file_reply::Result::Error(FileError { kind: 0, message: e.to_string() }),
                },
            };
            let reply = FileReply { id: req.id, result: Some(result), more: false };
            if tx.send(ClientMessage { msg: Some(client_message::Msg::File(reply)) }).await.is_err() {
                break;
            }
        }
        requests
    });
    assert!(served > 0, "the daemon asked the hostile client for nothing");

    let expected = run(&real_nvlink(), &invocation, &[]);
    assert_eq!(expected.code, 0, "nvlink fails with the library: the case proves nothing");
    let actual = run(&shim(), &invocation, &d.shim_env());
    assert_same(&expected, &actual, "the genuine link with the library was poisoned");
    std::fs::remove_dir_all(victim.path().join("lib")).unwrap();
    let expected = run(&real_nvlink(), &invocation, &[]);
    assert_ne!(expected.code, 0, "nvlink links without the library: the case proves nothing");
    let actual = run(&shim(), &invocation, &d.shim_env());
    assert_same(&expected, &actual, "the genuine link without the library was poisoned");
}

/// A link whose files come over its caller's stream (a remote shim, or any
/// client not sharing the daemon's view) never makes a local link wait on it:
/// such a caller answers file requests at its own pace (up to the reply
/// timeout each), so identical local links do not join its flight. Here the
/// streamed link is held as it stores its entry (`NVLINKD_TEST_HOLD_STORE`,
/// standing for a caller that stalls); the local shim's identical link is
/// answered meanwhile, with nvlink's bytes. (It waited for the leader: 37 s
/// and 87 s in an adversarial run.)
#[test]
fn a_local_link_never_waits_on_a_streamed_link_of_the_same_key() {
    use nvlinkd_proto::v1::{server_message, ServerMessage};
    let hold_dir = TempDir::new("sec-flight-hold");
    let hold = hold_dir.path().join("hold");
    std::fs::write(&hold, b"").unwrap();
    let d = Daemon::start_env(&[], &[("NVLINKD_TEST_HOLD_STORE", hold.to_str().unwrap())]);
    let out = TempDir::new("sec-flight-out");
    let invocation = inv(LINK, corpus::dir(), &out);
    let (args, socket) = (invocation.args.clone(), d.socket());
    let streamed = std::thread::spawn(move || {
        runtime().block_on(async {
            let channel =
                nvlinkd_proto::shared::connect_unix(nvlinkd_proto::shared::unix_endpoint(), socket).await.unwrap();
            let mut client = NvlinkdClient::new(channel);
            // cwd_dev/ino 0: not the daemon's view; every file comes over the stream.
            let start = Start { args, cwd: corpus::dir().display().to_string(), ..Default::default() };
            let (tx, rx) = tokio::sync::mpsc::channel::<ClientMessage>(64);
            tx.send(ClientMessage { msg: Some(client_message::Msg::Start(start)) }).await.unwrap();
            let mut inbound = client.link(tokio_stream::wrappers::ReceiverStream::new(rx)).await.unwrap().into_inner();
            let mut exit = None;
            while let Ok(Some(ServerMessage { msg: Some(m) })) = inbound.message().await {
                let req = match m {
                    server_message::Msg::File(req) => req,
                    server_message::Msg::Result(r) => {
                        exit = Some(r.exit_code);
                        continue;
                    }
                    _ => continue,
                };
                let reply = answer_from_disk(&req, &corpus::dir().join(&req.path));
                if tx.send(ClientMessage { msg: Some(client_message::Msg::File(reply)) }).await.is_err() {
                    break;
                }
            }
            exit
        })
    });
    // The streamed link leads the flight and is held storing its entry.
    held_storing(&d, &hold, "the streamed link");
    let expected = run(&real_nvlink(), &invocation, &[]);
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    let (local, env) = (invocation.clone(), d.shim_env());
    std::thread::spawn(move || done_tx.send(run(&shim(), &local, &env)));
    let local = done_rx.recv_timeout(Duration::from_secs(60));
    std::fs::remove_file(&hold).unwrap();
    let local = local.expect("the local link waited on the streamed link's flight");
    assert_same(&expected, &local, "the local link");
    assert_eq!(streamed.join().unwrap(), Some(0), "the streamed link failed");
}

// Content-addressed inputs (issue 10, item 4): a remote shim announces its
// files by BLAKE3 digest; the daemon reads them from its blob store and asks
// only for the blobs it lacks, each checked against its digest.

/// nvcc's device-link call: inputs, a missing `-L` directory, libcudadevrt.
const NVCC_LINK: &str = "-m64 --arch=sm_90 --register-link-binaries={OUT}/reg.c -L{L}/stubs -L{L} -cpu-arch=X86_64 \
                         accumulate.o scale.o -lcudadevrt -o {OUT}/out.cubin --host-ccbin gcc";

/// A directory holding copies of the inputs of [`NVCC_LINK`].
fn nvcc_link_inputs(tag: &str) -> TempDir {
    let dir = TempDir::new(tag);
    for f in ["accumulate.o", "scale.o"] {
        std::fs::copy(corpus::dir().join(f), dir.path().join(f)).unwrap();
    }
    dir
}

/// A second daemon serving TLS and tokens over `other`'s cache directory.
fn secure_daemon_sharing(pki: &Pki, other: &Daemon) -> (Daemon, u16) {
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let (cert, key, tokens) = (pki.file("cert.pem"), pki.file("key.pem"), pki.file("tokens"));
    let d = Daemon::start_sharing_with(
        other,
        &["--listen", &listen, "--tls-cert", &cert, "--tls-key", &key, "--token-file", &tokens],
    );
    (d, port)
}

fn assert_same(expected: &Run, actual: &Run, what: &str) {
    let cmp = compare::runs(expected, actual);
    assert!(cmp.problems.is_empty() && cmp.identical, "{what}: {:?}", cmp.problems);
}

#[test]
fn a_warm_remote_relink_uploads_no_input_bytes() {
    let pki = Pki::new();
    let (d, port) = secure_daemon(&pki);
    let inputs = nvcc_link_inputs("sec-cas-in");
    let out = TempDir::new("sec-cas-out");
    let link = inv(NVCC_LINK, inputs.path(), &out);
    let expected = run(&real_nvlink(), &link, &[]);
    assert_eq!(expected.code, 0);
    let env = remote_env(&pki, &format!("https://127.0.0.1:{port}"));

    // Cold: every input's bytes come over the stream, once.
    assert_same(&expected, &run(&shim(), &link, &env), "cold remote link");
    let cold = d.stat("input_bytes_received");
    let devrt = std::fs::metadata(cuda_home().join("lib/libcudadevrt.a")).unwrap().len();
    let objects: u64 =
        ["accumulate.o", "scale.o"].iter().map(|f| std::fs::metadata(inputs.path().join(f)).unwrap().len()).sum();
    assert_eq!(cold, objects + devrt, "the cold link received other than its inputs, once each");
    assert_eq!((d.stat("blob_misses"), d.stat("blob_hits")), (3, 0));

    // Warm: the same link again sends no input byte (and, its key digests
    // remembered by content, reads no blob: a whole-link hit).
    assert_same(&expected, &run(&shim(), &link, &env), "warm remote link");
    assert_eq!(d.stat("input_bytes_received"), cold, "a warm relink uploaded input bytes");
    assert_eq!(d.stat("blob_misses"), 3, "a warm relink missed a blob");
    assert_eq!(d.stat("cache_hits"), 1);

    // One input recompiled in place (other bytes, the same key): only its bytes travel.
    std::fs::copy(corpus::dir().join("twin/scale.o"), inputs.path().join("scale.o")).unwrap();
    let expected = run(&real_nvlink(), &link, &[]);
    assert_same(&expected, &run(&shim(), &link, &env), "relink after a change");
    let changed = std::fs::metadata(inputs.path().join("scale.o")).unwrap().len();
    assert_eq!(d.stat("input_bytes_received"), cold + changed, "more than the changed input was uploaded");
    assert_eq!(d.stat("blob_misses"), 4);

    // A fresh daemon over the same cache directory: the blobs are on disk.
    let (fresh, fresh_port) = secure_daemon_sharing(&pki, &d);
    let env = remote_env(&pki, &format!("https://127.0.0.1:{fresh_port}"));
    assert_same(&expected, &run(&shim(), &link, &env), "relink through a fresh daemon");
    assert_eq!(fresh.stat("input_bytes_received"), 0, "the fresh daemon had the inputs sent again");
    assert_eq!((fresh.stat("blob_misses"), fresh.stat("blob_hits")), (0, 3));
    assert_eq!(fresh.stat("fallbacks"), 0);
    drop(fresh);

    // Damaged blobs on disk are misses: asked for again, never used.
    let mut damaged = 0;
    for shard in std::fs::read_dir(d.cache_dir().join("blobs/v2")).unwrap().flatten() {
        for blob in std::fs::read_dir(shard.path()).unwrap().flatten() {
            let mut raw = std::fs::read(blob.path()).unwrap();
            *raw.last_mut().unwrap() ^= 1;
            std::fs::write(blob.path(), raw).unwrap();
            damaged += 1;
        }
    }
    assert_eq!(damaged, 4, "blobs on disk: 3 inputs and the changed one");
    let (again, again_port) = secure_daemon_sharing(&pki, &d);
    let env = remote_env(&pki, &format!("https://127.0.0.1:{again_port}"));
    assert_same(&expected, &run(&shim(), &link, &env), "relink over damaged blobs");
    assert_eq!(again.stat("input_bytes_received"), objects_now(&inputs) + devrt, "damaged blobs not sent again");
    assert_eq!(again.stat("fallbacks"), 0);
}

fn objects_now(inputs: &TempDir) -> u64 {
    ["accumulate.o", "scale.o"].iter().map(|f| std::fs::metadata(inputs.path().join(f)).unwrap().len()).sum()
}

/// What a hostile client on the remote listener does with one link.
struct Hostile {
    /// Announced: (path, digest, size) of each input.
    announce: Vec<(std::path::PathBuf, Vec<u8>, u64)>,
    /// The bytes it sends when a path is read.
    serve: std::collections::HashMap<std::path::PathBuf, Vec<u8>>,
    /// The environment it sends in `Start`.
    env: Vec<(String, String)>,
}

/// Run `args` in `cwd` as `hostile` over TLS with the token; the daemon's
/// result and the output files it sent, by path.
fn hostile_link_outputs(
    pki: &Pki,
    port: u16,
    args: &[String],
    cwd: &Path,
    hostile: &Hostile,
) -> (LinkResult, std::collections::BTreeMap<String, Vec<u8>>) {
    use nvlinkd_proto::v1::{file_reply, file_request, server_message, AnnouncedFile, FileError, FileReply};
    runtime().block_on(async {
        let mut client = NvlinkdClient::new(tls_channel(pki, port).await);
        let files = hostile
            .announce
            .iter()
            .map(|(p, digest, size)| AnnouncedFile {
                path: p.display().to_string(),
                exists: true,
                is_dir: false,
                size: *size,
                blake3: digest.clone(),
            })
            .collect();
        let start = Start {
            args: args.to_vec(),
            cwd: cwd.display().to_string(),
            toolkit_release: String::new(),
            files,
            env: hostile.env.iter().cloned().collect(),
            ..Default::default()
        };
        let mut outputs = std::collections::BTreeMap::<String, Vec<u8>>::new();
        let (tx, rx) = tokio::sync::mpsc::channel::<ClientMessage>(64);
        tx.send(ClientMessage { msg: Some(client_message::Msg::Start(start)) }).await.unwrap();
        let mut inbound =
            client.link(with_token(tokio_stream::wrappers::ReceiverStream::new(rx), TOKEN)).await.unwrap().into_inner();
        loop {
            let m = inbound.message().await.expect("the daemon's stream").expect("a result");
            let req = match m.msg {
                Some(server_message::Msg::File(req)) => req,
                Some(server_message::Msg::Output(o)) => {
                    outputs.entry(o.path.clone()).or_default().extend_from_slice(&o.data);
                    continue;
                }
                Some(server_message::Msg::Result(r)) => return (r, outputs),
                _ => continue,
            };
            let path = Path::new(&req.path);
            let result = match (req.op(), hostile.serve.get(path)) {
                (file_request::Op::Read, Some(data)) => file_reply::Result::Data(data.clone().into()),
                (file_request::Op::Read, None) => match std::fs::read(path) {
                    Ok(data) => file_reply::Result::Data(data.into()),
                    Err(e) => file_reply::Result::Error(FileError { kind: 0, message: e.to_string() }),
                },
                (file_request::Op::Stat, _) => match std::fs::metadata(path) {
                    Ok(m) => {
                        file_reply::Result::Stat(nvlinkd_proto::v1::FileStat { is_dir: m.is_dir(), size: m.len() })
                    }
                    Err(e) => file_reply::Result::Error(FileError { kind: 0, message: e.to_string() }),
                },
            };
            let reply = FileReply { id: req.id, result: Some(result), more: false };
            tx.send(ClientMessage { msg: Some(client_message::Msg::File(reply)) }).await.unwrap();
        }
    })
}

fn hostile_link(pki: &Pki, port: u16, args: &[String], cwd: &Path, hostile: &Hostile) -> LinkResult {
    hostile_link_outputs(pki, port, args, cwd, hostile).0
}

/// `accumulate.o` announced by its own digest, served as other bytes of the same
/// size (scale.o's, padded: an object that links, to something else).
fn lying_about_accumulate(inputs: &Path) -> Hostile {
    let genuine = std::fs::read(inputs.join("accumulate.o")).unwrap();
    let mut other = std::fs::read(inputs.join("scale.o")).unwrap();
    assert!(other.len() <= genuine.len());
    other.resize(genuine.len(), 0);
    let digest = blake3::hash(&genuine).as_bytes().to_vec();
    Hostile {
        announce: vec![(inputs.join("accumulate.o"), digest, genuine.len() as u64)],
        serve: [(inputs.join("accumulate.o"), other)].into_iter().collect(),
        env: Vec::new(),
    }
}

#[test]
fn a_blob_that_does_not_match_its_digest_is_refused_and_nothing_is_cached() {
    let pki = Pki::new();
    let (d, port) = secure_daemon(&pki);
    let inputs = nvcc_link_inputs("sec-cas-lie-in");
    let out = TempDir::new("sec-cas-lie-out");
    let link = inv(NVCC_LINK, inputs.path(), &out);
    let result = hostile_link(&pki, port, &link.args, inputs.path(), &lying_about_accumulate(inputs.path()));
    assert!(result.fallback, "the daemon answered a link whose input was not as announced: {result:?}");
    assert_eq!(d.stat("blob_rejected"), 1);
    assert_eq!(d.stat("cache_disk_bytes"), 0, "something of the refused link was cached");
    // Sizes that disagree are refused too.
    let mut wrong_size = lying_about_accumulate(inputs.path());
    wrong_size.serve.values_mut().for_each(|v| v.push(0));
    wrong_size.announce[0].2 += 1;
    let result = hostile_link(&pki, port, &link.args, inputs.path(), &wrong_size);
    assert!(result.fallback, "{result:?}");
    assert_eq!(d.stat("blob_rejected"), 2);
    assert_eq!(d.stat("cache_disk_bytes"), 0);
    assert!(d.answers(), "the daemon died");
}

/// The poisoning attempt under content addressing: a client announces the
/// genuine input's digest and sends other bytes. Were they kept under that
/// digest (or the result under any key), the genuine caller's next link —
/// which announces the same digest and sends nothing — would get the
/// attacker's output; it must get nvlink's.
#[test]
fn a_lying_client_cannot_poison_a_later_genuine_link() {
    let pki = Pki::new();
    let (d, port) = secure_daemon(&pki);
    let inputs = nvcc_link_inputs("sec-cas-poison-in");
    let out = TempDir::new("sec-cas-poison-out");
    let link = inv(NVCC_LINK, inputs.path(), &out);
    let _ = hostile_link(&pki, port, &link.args, inputs.path(), &lying_about_accumulate(inputs.path()));
    let expected = run(&real_nvlink(), &link, &[]);
    assert_eq!(expected.code, 0);
    let actual = run(&shim(), &link, &remote_env(&pki, &format!("https://127.0.0.1:{port}")));
    assert_same(&expected, &actual, "the genuine link after the attack was poisoned");
    assert_eq!(d.stat("fallbacks"), 1, "only the attacker's link falls back");
}

/// Over a network the daemon's answer comes back zstd-compressed: the bytes on
/// the wire towards the shim (counted by an emulated link in front of the
/// daemon, `wan.rs`) stay well below the output's size, and the output is
/// nvlink's. A warm relink's answer is mostly its output, so this is what
/// keeps it within a few round trips on a slow link.
#[test]
fn remote_answers_travel_compressed() {
    const LTO: &str = "--arch=sm_90 -dlto -nvvmpath={NVVM} -L{L} select_flagged_lto.o select_xform_lto.o -lcudadevrt -o {OUT}/out.cubin";
    let pki = Pki::new();
    let (d, port) = secure_daemon(&pki);
    let wan = nvlinkd_tests::wan::Wan::emulated(Duration::ZERO, 10_000);
    let addr = format!("https://{}", wan.expose(port));
    let out = TempDir::new("sec-zstd-ref");
    let expected = run(&real_nvlink(), &inv(LTO, corpus::dir(), &out), &[]);
    assert_eq!(expected.code, 0);
    let output: u64 = expected.files.values().map(|f| f.len() as u64).sum();
    let out = TempDir::new("sec-zstd");
    let actual = run(&shim(), &inv(LTO, corpus::dir(), &out), &remote_env(&pki, &addr));
    assert_same(&expected, &actual, "remote LTO link");
    assert_eq!(d.stat("fallbacks"), 0);
    let (up, down) = wan.wire_bytes();
    assert!(up > 0, "nothing went through the emulated link");
    assert!(down * 3 < output, "{down} bytes came back for a {output}-byte output: not compressed");
}

/// Links that start together on a daemon lacking their inputs share each
/// input's upload (`blobs.rs`, flights): the first link's shim sends a blob,
/// the other links wait for it and read it from the store. Four shims start
/// nvcc's link of the same objects at once over a slow emulated network; the
/// daemon receives each input once, and every output is nvlink's.
#[test]
fn links_started_together_upload_each_input_once() {
    let pki = Pki::new();
    let (d, port) = secure_daemon(&pki);
    let wan = nvlinkd_tests::wan::Wan::emulated(Duration::ZERO, 8);
    let env = remote_env(&pki, &format!("https://{}", wan.expose(port)));
    let inputs = nvcc_link_inputs("sec-flight-in");
    let outs: Vec<TempDir> = (0..4).map(|i| TempDir::new(&format!("sec-flight-{i}"))).collect();
    let expected = run(&real_nvlink(), &inv(NVCC_LINK, inputs.path(), &outs[0]), &[]);
    assert_eq!(expected.code, 0);
    let runs: Vec<Run> = std::thread::scope(|s| {
        let handles: Vec<_> = outs
            .iter()
            .map(|out| {
                let (link, env) = (inv(NVCC_LINK, inputs.path(), out), env.clone());
                s.spawn(move || run(&shim(), &link, &env))
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("shim thread")).collect()
    });
    for (i, r) in runs.iter().enumerate() {
        assert_same(&expected, r, &format!("link {i} of four started together"));
    }
    let devrt = std::fs::metadata(cuda_home().join("lib/libcudadevrt.a")).unwrap().len();
    assert_eq!(d.stat("requests"), 4);
    assert_eq!(d.stat("fallbacks"), 0);
    assert_eq!(
        d.stat("input_bytes_received"),
        objects_now(&inputs) + devrt,
        "the inputs of four links started together crossed the network more than once"
    );
}

/// A token holder's environment never reaches a process of the daemon's:
/// a routed remote link (run by the daemon's nvlink in a sandbox) sent with
/// every loader and runtime variable pointing at a library whose constructor
/// leaves a mark. Nothing leaves the mark, the answer is nvlink's, and an
/// honest client's identical link afterwards gets nvlink's bytes too.
#[test]
fn no_client_environment_reaches_a_process() {
    let pki = Pki::new();
    let (d, port) = secure_daemon(&pki);
    let work = TempDir::new("sec-env-so");
    let mark = work.path().join("constructor-ran");
    let src = work.path().join("evil.c");
    std::fs::write(
        &src,
        format!(
            "#include <stdio.h>\n__attribute__((constructor)) static void evil(void) {{ FILE *f = fopen(\"{}\", \"a\"); \
             if (f) {{ fputs(\"ran\\n\", f); fclose(f); }} }}\nunsigned la_version(unsigned v) {{ evil(); return v; }}\n",
            mark.display()
        ),
    )
    .unwrap();
    let so = work.path().join("libevil.so");
    let cc = Command::new("gcc").args(["-shared", "-fPIC", "-o"]).arg(&so).arg(&src).output().expect("gcc");
    assert!(cc.status.success(), "{}", String::from_utf8_lossy(&cc.stderr));
    // The library works: it leaves its mark in a process that loads it.
    let probe = Command::new("true").env("LD_PRELOAD", &so).status().unwrap();
    assert!(probe.success() && mark.exists(), "the probe library does not mark");
    std::fs::remove_file(&mark).unwrap();

    let so_s = so.display().to_string();
    let dir_s = work.path().display().to_string();
    let hostile_env: Vec<(&str, &str)> = vec![
        ("LD_PRELOAD", &so_s),
        ("LD_AUDIT", &so_s),
        ("LD_LIBRARY_PATH", &dir_s),
        ("GCONV_PATH", &dir_s),
        ("MALLOC_CHECK_", "3"),
        ("MALLOC_PERTURB_", "165"),
        ("TMPDIR", "/etc"),
        ("PATH", &dir_s),
        ("CUDA_HOME", &dir_s),
        ("NVLINKD_LOG", "trace"),
    ];
    let inputs = nvcc_link_inputs("sec-env-in");
    let out = TempDir::new("sec-env-out");
    // --preserve-relocs is routed: the daemon's real nvlink serves it.
    let link = inv("--arch=sm_90 --preserve-relocs accumulate.o scale.o -o {OUT}/out.cubin", inputs.path(), &out);
    let expected = run(&real_nvlink(), &link, &[]);
    assert_eq!(expected.code, 0);
    let hostile = Hostile {
        announce: Vec::new(),
        serve: Default::default(),
        env: hostile_env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
    };
    let (result, outputs) = hostile_link_outputs(&pki, port, &link.args, inputs.path(), &hostile);
    let data = outputs.iter().find(|(p, _)| p.ends_with("out.cubin")).map(|(_, d)| d.clone()).unwrap_or_default();
    assert!(!mark.exists(), "a client's environment reached a process of the daemon's");
    assert!(!result.fallback, "the hostile link was not served: {result:?}");
    assert_eq!(result.exit_code, expected.code);
    assert_eq!(
        compare::file(&expected.files["out.cubin"], &data),
        compare::Verdict::Identical,
        "the hostile link's output is not nvlink's"
    );
    assert!(d.stat("nvlink_process") >= 1, "the link was not routed to the daemon's nvlink: {}", d.stats());
    // An honest client's identical link: nvlink's bytes.
    let honest = run(&shim(), &link, &remote_env(&pki, &format!("https://127.0.0.1:{port}")));
    assert_same(&expected, &honest, "an honest link after the hostile one");
    assert!(!mark.exists());
}

/// `-o /dev/stdout` (or `/dev/fd/1`, or `/proc/self/fd/1`) names the caller's
/// own descriptor: the cubin comes out on the caller's stdout as nvlink's
/// does, the daemon never sees the link (its `/dev/stdout` is its own), and
/// `/dev/stdout` is still the link it was.
#[test]
fn an_output_naming_the_callers_descriptors_is_the_callers() {
    let d = Daemon::start();
    let out = TempDir::new("sec-stdout");
    for target in ["/dev/stdout", "/dev/fd/1", "/proc/self/fd/1"] {
        let link = Invocation {
            args: ["--arch=sm_90", "accumulate.o", "scale.o", "-o", target].map(str::to_owned).to_vec(),
            cwd: corpus::dir().clone(),
            env: Vec::new(),
            out_dir: out.path().to_owned(),
        };
        let expected = run(&real_nvlink(), &link, &[]);
        assert_eq!(expected.code, 0, "{target}");
        assert!(expected.stdout.len() > 1000, "nvlink wrote no cubin to {target}");
        let actual = run(&shim(), &link, &d.shim_env());
        assert_eq!(actual.code, expected.code, "{target}: {}", String::from_utf8_lossy(&actual.stderr));
        assert!(actual.stdout == expected.stdout, "{target}: the cubin on stdout is not nvlink's");
    }
    assert_eq!(d.stat("requests"), 0, "a link naming the caller's descriptors reached the daemon");
    let dev_stdout = std::fs::symlink_metadata("/dev/stdout").expect("/dev/stdout");
    assert!(dev_stdout.file_type().is_symlink(), "/dev/stdout is no longer a symlink");
}

/// An options file that is the caller's stdin through a chain of links, or
/// through a directory link to `/proc/self`: nvlink reads its own stdin, and
/// so does the shim's link (the real nvlink, run by the shim), never the
/// daemon's (whose stdin is its own: with `NVLINKD_FALLBACK=never` the link
/// failed).
#[test]
fn an_options_file_reaching_the_callers_stdin_through_links_is_the_callers() {
    let d = Daemon::start();
    let dir = TempDir::new("sec-stdin-chain");
    for f in ["accumulate.o", "scale.o"] {
        std::fs::copy(corpus::dir().join(f), dir.path().join(f)).unwrap();
    }
    std::os::unix::fs::symlink("c", dir.path().join("a2")).unwrap();
    std::os::unix::fs::symlink("/dev/stdin", dir.path().join("c")).unwrap();
    std::os::unix::fs::symlink("/proc/self", dir.path().join("d")).unwrap();
    std::fs::write(dir.path().join("opts"), "--arch=sm_90\n").unwrap();
    let mut env = d.shim_env();
    env.push(("NVLINKD_FALLBACK".into(), "never".into()));
    for optf in ["a2", "d/fd/0"] {
        let link = |program: &Path, env: &[(String, String)]| {
            let _ = std::fs::remove_file(dir.path().join("out.cubin"));
            let out = Command::new(program)
                .args(["--options-file", optf, "accumulate.o", "scale.o", "-o", "out.cubin"])
                .current_dir(dir.path())
                .envs(env.iter().cloned())
                .stdin(std::fs::File::open(dir.path().join("opts")).unwrap())
                .output()
                .unwrap();
            (out.status.code(), out.stderr, std::fs::read(dir.path().join("out.cubin")).ok())
        };
        let expected = link(&real_nvlink(), &[]);
        assert_eq!(expected.0, Some(0), "{optf}: nvlink no longer reads its stdin: {:?}", expected.1);
        let actual = link(&shim(), &env);
        assert_eq!(actual, expected, "{optf}: {}", String::from_utf8_lossy(&actual.1));
    }
    // A library `-l` finds along `-L` that is the caller's stdin.
    std::fs::create_dir(dir.path().join("lib")).unwrap();
    std::os::unix::fs::symlink("/dev/stdin", dir.path().join("lib/libdevmath.a")).unwrap();
    std::fs::copy(corpus::dir().join("mathlib_main.o"), dir.path().join("mathlib_main.o")).unwrap();
    let link = |program: &Path, env: &[(String, String)]| {
        let _ = std::fs::remove_file(dir.path().join("out.cubin"));
        let out = Command::new(program)
            .args(["--arch=sm_90", "mathlib_main.o", "-Lnone", "-Llib", "-ldevmath", "-o", "out.cubin"])
            .current_dir(dir.path())
            .envs(env.iter().cloned())
            .stdin(std::fs::File::open(corpus::dir().join("lib/libdevmath.a")).unwrap())
            .output()
            .unwrap();
        (out.status.code(), out.stderr, std::fs::read(dir.path().join("out.cubin")).ok())
    };
    let expected = link(&real_nvlink(), &[]);
    assert_eq!(expected.0, Some(0), "nvlink no longer reads a library from its stdin: {:?}", expected.1);
    let actual = link(&shim(), &env);
    assert_eq!(actual, expected, "a library on stdin: {}", String::from_utf8_lossy(&actual.1));
    assert_eq!(d.stat("requests"), 0, "a link reading the caller's stdin reached the daemon");
}

/// A flood of TCP connections that never start their TLS handshake: those
/// past the caps are closed at once, the others when the handshake deadline
/// passes; meanwhile a local link is answered at once and the daemon stays
/// idle (no accept loop spinning), and once the flood ends remote links go
/// through again.
#[test]
fn a_connection_flood_starves_nothing() {
    use std::io::Read;
    use std::net::TcpStream;
    use std::time::Instant;
    let pki = Pki::new();
    let (d, port) = tls_daemon(&pki, &["--max-connections", "64"]);
    let flood: Vec<TcpStream> = (0..300).filter_map(|_| TcpStream::connect(("127.0.0.1", port)).ok()).collect();
    assert!(flood.len() >= 290, "the flood could not connect");
    // One address gets a quarter of the 64: 16 admitted, the rest closed.
    let deadline = Instant::now() + Duration::from_secs(20);
    while d.stat("tcp_connections_refused") < flood.len() as u64 - 16 {
        assert!(Instant::now() < deadline, "connections past the caps were not refused: {}", d.stats());
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(d.stat("tcp_connections"), 16, "{}", d.stats());
    // A local link meanwhile: answered, and promptly.
    let out = TempDir::new("sec-flood-out");
    let link = inv(LINK, corpus::dir(), &out);
    let expected = run(&real_nvlink(), &link, &[]);
    let t0 = Instant::now();
    let local = run(&shim(), &link, &d.shim_env());
    assert_same(&expected, &local, "a local link during the flood");
    assert!(t0.elapsed() < Duration::from_secs(10), "the local link took {:?}", t0.elapsed());
    // The daemon idles under the flood: under 0.3 s of CPU in 2 s.
    let pid = d.pid().expect("daemon pid");
    let ticks = nvlinkd_tests::daemon::cpu_ticks_over(pid, Duration::from_secs(2));
    assert!(ticks < 30, "the daemon used {ticks} ticks of CPU in 2 s under the flood");
    // An admitted connection that never shakes hands is closed at the deadline.
    let mut waiting = flood.into_iter().next().unwrap();
    waiting.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let t0 = Instant::now();
    let mut buf = [0u8; 16];
    let closed = matches!(waiting.read(&mut buf), Ok(0) | Err(_));
    assert!(closed && t0.elapsed() < Duration::from_secs(15), "a silent connection was kept {:?}", t0.elapsed());
    drop(waiting);
    // The flood over, remote links go through.
    let remote = run(&shim(), &link, &remote_env(&pki, &format!("https://127.0.0.1:{port}")));
    assert_same(&expected, &remote, "a remote link after the flood");
    assert!(d.answers(), "the daemon died");
}

/// A flood from many addresses past the daemon's open-file limit (640
/// half-open connections against a limit of 256): the cap (half the limit)
/// holds, descriptors stay for the local socket and the cache, local links are
/// answered promptly, the daemon idles, and remote links resume after.
#[test]
fn a_flood_past_the_file_limit_starves_nothing() {
    use std::net::TcpStream;
    use std::time::Instant;
    let pki = Pki::new();
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let (cert, key, tokens) = (pki.file("cert.pem"), pki.file("key.pem"), pki.file("tokens"));
    let d = Daemon::start_with_file_limit(
        &["--listen", &listen, "--tls-cert", &cert, "--tls-key", &key, "--token-file", &tokens],
        256,
    );
    let flood: Vec<TcpStream> = runtime().block_on(async {
        let mut flood = Vec::new();
        for source in 2..10u8 {
            for _ in 0..80 {
                let s = tokio::net::TcpSocket::new_v4().unwrap();
                if s.bind(std::net::SocketAddr::from(([127, 0, 0, source], 0))).is_err() {
                    continue;
                }
                if let Ok(Ok(c)) =
                    tokio::time::timeout(Duration::from_secs(2), s.connect(([127, 0, 0, 1], port).into())).await
                {
                    flood.push(c.into_std().unwrap());
                }
            }
        }
        flood
    });
    assert!(flood.len() > 256, "the flood could not pass the file limit: {} connections", flood.len());
    // Every connection is either refused at once, or admitted under the cap
    // and closed at the handshake deadline; on a slow machine the first
    // admitted ones may already be closed when the last ones arrive, which
    // makes room under the cap. The cap itself must hold at every sample.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let open = d.stat("tcp_connections");
        assert!(open <= 128, "the cap did not hold: {}", d.stats());
        let settled = d.stat("tcp_connections_refused") + d.stat("tls_handshake_failures") + open;
        if settled >= flood.len() as u64 {
            break;
        }
        assert!(Instant::now() < deadline, "connections past the cap were not refused: {}", d.stats());
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(d.stat("tcp_connections_refused") >= flood.len() as u64 - 256, "{}", d.stats());
    let out = TempDir::new("sec-fdflood-out");
    let link = inv(LINK, corpus::dir(), &out);
    let expected = run(&real_nvlink(), &link, &[]);
    let t0 = Instant::now();
    assert_same(&expected, &run(&shim(), &link, &d.shim_env()), "a local link during the flood");
    assert!(t0.elapsed() < Duration::from_secs(10), "the local link took {:?}", t0.elapsed());
    let pid = d.pid().expect("daemon pid");
    let ticks = nvlinkd_tests::daemon::cpu_ticks_over(pid, Duration::from_secs(2));
    assert!(ticks < 30, "the daemon used {ticks} ticks of CPU in 2 s under the flood");
    drop(flood);
    let remote = run(&shim(), &link, &remote_env(&pki, &format!("https://127.0.0.1:{port}")));
    assert_same(&expected, &remote, "a remote link after the flood");
    assert!(d.answers(), "the daemon died");
}

/// A flood of idle connections on the unix socket past the daemon's
/// open-file limit (300 against a limit of 128): connections past the local
/// cap (a quarter of the limit) are closed at once and the admitted ones that
/// make no call soon after, so the accept loop never runs out of descriptors
/// (it spun on EMFILE) and the daemon idles; a local link is answered
/// promptly. Another user's flood on a socket opened to all takes a few
/// slots only: the daemon's own user links at once.
#[test]
fn a_unix_socket_flood_past_the_file_limit_starves_nothing() {
    use std::io::BufRead;
    use std::os::unix::fs::PermissionsExt;
    use std::time::Instant;
    let d = Daemon::start_with_file_limit(&[], 128);
    let socket = d.socket();
    let flood: Vec<std::os::unix::net::UnixStream> =
        (0..300).filter_map(|_| std::os::unix::net::UnixStream::connect(&socket).ok()).collect();
    assert!(flood.len() > 128, "the flood could not pass the file limit: {} connections", flood.len());
    // The admitted connections past half the cap have a second for a call.
    std::thread::sleep(Duration::from_secs(2));
    let pid = d.pid().expect("daemon pid");
    let ticks = nvlinkd_tests::daemon::cpu_ticks_over(pid, Duration::from_secs(2));
    assert!(ticks < 30, "the daemon used {ticks} ticks of CPU in 2 s under the flood");
    let out = TempDir::new("sec-unixflood-out");
    let link = inv(LINK, corpus::dir(), &out);
    let expected = run(&real_nvlink(), &link, &[]);
    let t0 = Instant::now();
    assert_same(&expected, &run(&shim(), &link, &d.shim_env()), "a local link during the flood");
    assert!(t0.elapsed() < Duration::from_secs(10), "the local link took {:?}", t0.elapsed());
    drop(flood);
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped the other user's flood: needs root");
        return;
    }
    std::fs::set_permissions(socket.parent().unwrap(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o777)).unwrap();
    let script = format!(
        "import socket,sys,time\nss=[]\nfor i in range(200):\n  s=socket.socket(socket.AF_UNIX)\n  \
         try: s.connect('{}'); ss.append(s)\n  except OSError: pass\nprint(len(ss),flush=True)\ntime.sleep(30)\n",
        socket.display()
    );
    let spawned = Command::new("setpriv")
        .args(["--reuid=nobody", "--regid=nogroup", "--clear-groups", "--", "/usr/bin/python3", "-c", &script])
        .stdout(Stdio::piped())
        .spawn();
    let Ok(mut theirs) = spawned else {
        eprintln!("skipped the other user's flood: no setpriv or python3");
        return;
    };
    let mut line = String::new();
    let _ = std::io::BufReader::new(theirs.stdout.take().unwrap()).read_line(&mut line);
    let t0 = Instant::now();
    let mine = run(&shim(), &link, &d.shim_env());
    let took = t0.elapsed();
    let _ = theirs.kill();
    let _ = theirs.wait();
    if line.trim().parse::<usize>().unwrap_or(0) < 100 {
        eprintln!("skipped the other user's flood: it made {line:?} connections");
        return;
    }
    assert_same(&expected, &mine, "a local link during another user's flood");
    assert!(took < Duration::from_secs(5), "the local link took {took:?} during another user's flood");
}

/// Another user's symlink in a sticky, world-writable directory (`/tmp`'s
/// kind) as the output: with `fs.protected_symlinks` the kernel refuses to
/// follow it for nvlink ("Could not open output file", exit 1), and so for
/// the shim: the link's target is left alone. The sysctl is set for the test
/// where it is off, and put back.
#[test]
fn another_users_symlink_in_a_sticky_directory_is_not_followed() {
    use std::os::unix::fs::PermissionsExt;
    const SYSCTL: &str = "/proc/sys/fs/protected_symlinks";
    let Ok(was) = std::fs::read_to_string(SYSCTL) else {
        eprintln!("SKIP: no {SYSCTL}");
        return;
    };
    if was.trim() != "1" && std::fs::write(SYSCTL, "1").is_err() {
        eprintln!("SKIP: cannot set {SYSCTL}");
        return;
    }
    struct Restore(String);
    impl Drop for Restore {
        fn drop(&mut self) {
            let _ = std::fs::write(SYSCTL, self.0.trim());
        }
    }
    let _restore = Restore(was);
    let d = Daemon::start();
    let dir = TempDir::new("sec-symlink");
    let sticky = dir.path().join("sticky");
    std::fs::create_dir(&sticky).unwrap();
    std::fs::set_permissions(&sticky, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let victim = dir.path().join("victim");
    std::fs::write(&victim, b"precious").unwrap();
    let link_path = sticky.join("out.cubin");
    std::os::unix::fs::symlink(&victim, &link_path).unwrap();
    std::os::unix::fs::lchown(&link_path, Some(65534), Some(65534)).unwrap();
    let link = Invocation {
        args: ["--arch=sm_90", "accumulate.o", "scale.o", "-o"]
            .map(str::to_owned)
            .into_iter()
            .chain([link_path.display().to_string()])
            .collect(),
        cwd: corpus::dir().clone(),
        env: Vec::new(),
        out_dir: dir.path().join("unused"),
    };
    let expected = run(&real_nvlink(), &link, &[]);
    assert_eq!(expected.code, 1, "nvlink followed the link: {}", String::from_utf8_lossy(&expected.stderr));
    let actual = run(&shim(), &link, &d.shim_env());
    assert_eq!(actual.code, expected.code);
    assert_eq!(String::from_utf8_lossy(&actual.stderr), String::from_utf8_lossy(&expected.stderr));
    assert_eq!(std::fs::read(&victim).unwrap(), b"precious", "the shim wrote through another user's symlink");

    // A directory link on the way: the kernel follows it for nvlink
    // (`protected_symlinks` judges the last component only), and the shim
    // writes where nvlink writes.
    let victim_dir = dir.path().join("victim-dir");
    std::fs::create_dir(&victim_dir).unwrap();
    let dir_link = sticky.join("build");
    std::os::unix::fs::symlink(&victim_dir, &dir_link).unwrap();
    std::os::unix::fs::lchown(&dir_link, Some(65534), Some(65534)).unwrap();
    let mut through_dir = link.clone();
    *through_dir.args.last_mut().unwrap() = dir_link.join("out.cubin").display().to_string();
    let nvlinks = |r: &Run| {
        let written = std::fs::read(victim_dir.join("out.cubin")).ok().map(|b| blake3::hash(&b).to_hex().to_string());
        (r.code, String::from_utf8_lossy(&r.stderr).into_owned(), written)
    };
    let expected = nvlinks(&run(&real_nvlink(), &through_dir, &[]));
    let _ = std::fs::remove_file(victim_dir.join("out.cubin"));
    let actual = nvlinks(&run(&shim(), &through_dir, &d.shim_env()));
    assert_eq!(actual, expected, "not where nvlink writes through a directory link");
}

/// mTLS from the shim: a daemon that requires client certificates
/// (`--client-ca`, no token file) links for a shim presenting one
/// (`NVLINKD_TLS_CERT`, `NVLINKD_TLS_KEY`), byte-identical to nvlink; a shim
/// without one is refused at the handshake, and then fails
/// (`NVLINKD_FALLBACK=never`) or runs the real nvlink. The link is counted
/// by the certificate's subject (`certificates` in the stats).
#[test]
fn a_shim_with_a_client_certificate_links_where_one_is_required() {
    let pki = Pki::new();
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let (cert, key, ca) = (pki.file("cert.pem"), pki.file("key.pem"), pki.file("ca.pem"));
    let d = Daemon::start_with(&["--listen", &listen, "--tls-cert", &cert, "--tls-key", &key, "--client-ca", &ca]);
    let out = TempDir::new("sec-mtls-out");
    let link = inv(LINK, corpus::dir(), &out);
    let expected = run(&real_nvlink(), &link, &[]);
    let env = |fallback: &str, client_cert: bool| {
        let mut env = pki.shim_env(&format!("https://127.0.0.1:{port}"), fallback);
        env.retain(|(k, _)| k != paths::ENV_TOKEN_FILE);
        if client_cert {
            env.push((paths::ENV_TLS_CERT.into(), pki.file("client.pem")));
            env.push((paths::ENV_TLS_KEY.into(), pki.file("client-key.pem")));
        }
        env
    };
    assert_same(&expected, &run(&shim(), &link, &env("never", true)), "with a client certificate");
    assert_eq!(d.stat("requests"), 1, "the daemon did not serve the link");
    assert_eq!(d.stat("fallbacks"), 0);
    // Its audit line names the certificate's subject (there is no token).
    let audit = d.wait_log("remote link done", 1);
    assert!(audit[0].contains("subject=\"CN=build-machine\"") && audit[0].contains("token=- "), "{audit:?}");
    // Its figures, by the certificate's subject.
    let stats = d.stats();
    assert_eq!(stats["certificates"]["CN=build-machine"]["links"], 1, "{stats}");
    assert!(stats["certificates"]["CN=build-machine"]["bytes_sent"].as_u64() > Some(0), "{stats}");

    let refused = run(&shim(), &link, &env("never", false));
    assert_ne!(refused.code, 0, "linked without a client certificate");
    assert!(refused.files.is_empty(), "output written without a daemon's answer");
    assert_same(&expected, &run(&shim(), &link, &env("auto", false)), "falling back without one");
    assert_eq!(d.stat("requests"), 1, "the daemon served a shim without a certificate");
    assert!(d.stat("tls_handshake_failures") >= 2, "{}", d.stats());
    // A key without its certificate is a mistake the shim names (and falls back from).
    let mut half = env("never", true);
    half.retain(|(k, _)| k != paths::ENV_TLS_CERT);
    let r = run(&shim(), &link, &half);
    assert_ne!(r.code, 0);
    assert!(String::from_utf8_lossy(&r.stderr).contains("NVLINKD_TLS_KEY is set without NVLINKD_TLS_CERT"));
}

/// Failed TLS handshakes and refused tokens are logged with the peer's
/// address, at most one line each per 10 s however many there are; the
/// counters count them all.
#[test]
fn failed_handshakes_and_tokens_are_logged_with_the_peer_rate_limited() {
    use std::io::{Read, Write};
    let pki = Pki::new();
    let (d, port) = secure_daemon(&pki);
    for _ in 0..5 {
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        let mut rest = Vec::new();
        let _ = s.read_to_end(&mut rest);
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while d.stat("tls_handshake_failures") < 5 {
        assert!(std::time::Instant::now() < deadline, "{}", d.stats());
        std::thread::sleep(Duration::from_millis(20));
    }
    let lines = d.wait_log("TLS handshake failed", 1);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(lines[0].contains("peer=127.0.0.1:") && lines[0].contains("WARN"), "{lines:?}");

    runtime().block_on(async {
        let mut client = NvlinkdClient::new(tls_channel(&pki, port).await);
        for _ in 0..5 {
            let e = client.stats(with_token(StatsRequest {}, "wrong")).await.unwrap_err();
            assert_eq!(e.code(), Code::Unauthenticated, "{e:?}");
        }
    });
    assert_eq!(d.stat("auth_failures"), 5);
    let lines = d.wait_log("without a valid bearer token refused", 1);
    std::thread::sleep(Duration::from_millis(200));
    let lines_now = d.wait_log("without a valid bearer token refused", 1);
    assert_eq!((lines.len(), lines_now.len()), (1, 1), "{lines_now:?}");
    assert!(lines[0].contains("peer=127.0.0.1:"), "{lines:?}");
}

/// Arguments come from clients: a newline in one (here in an `-L` directory,
/// which nvlink accepts) cannot forge a line of the daemon's log, nor can a
/// terminal escape reach it raw. The link is still nvlink's.
#[test]
fn a_newline_in_an_argument_cannot_forge_a_log_line() {
    let forged = "2026-11-27T00:00:00.000000Z  INFO nvlinkd: forged";
    let d = Daemon::start();
    let out = TempDir::new("sec-log-out");
    let mut link = inv(LINK, corpus::dir(), &out);
    link.args.push(format!("-L/nonexistent\n{forged}\u{1b}[2J"));
    let expected = run(&real_nvlink(), &link, &[]);
    let actual = run(&shim(), &link, &d.shim_env());
    let cmp = compare::runs(&expected, &actual);
    assert!(cmp.problems.is_empty() && cmp.identical, "{:?}", cmp.problems);
    let lines = d.wait_log("link done", 1);
    assert!(lines[0].contains("\\n2026-11-27T00:00:00.000000Z") && lines[0].contains("\\u{1b}[2J"), "{lines:?}");
    let log = d.log();
    assert!(!log.lines().any(|l| l.starts_with(forged)), "a forged line in the log:\n{log}");
    assert!(!log.contains('\u{1b}'), "a raw escape in the log:\n{log}");
}

/// A client's command line must not keep the daemon busy for minutes: one
/// that expands past the daemon's bounds (options files naming eight others,
/// six deep: 37 448 openings; 400 `-L` by 300 `-l`: 120 000 library lookups)
/// is left to nvlink, whose answer the shim gives, counted as a fallback.
#[test]
fn a_command_line_past_the_daemons_bounds_is_left_to_nvlink() {
    let d = Daemon::start();
    let work = TempDir::new("sec-bounds");
    for f in ["accumulate.o", "scale.o"] {
        std::fs::copy(corpus::dir().join(f), work.path().join(f)).unwrap();
    }
    for level in 0..6 {
        let next = if level < 5 { format!("-optf f{}.opts ", level + 1).repeat(8) } else { "-w".into() };
        std::fs::write(work.path().join(format!("f{level}.opts")), next).unwrap();
    }
    let lookups: String =
        (0..400).map(|i| format!(" -L/nonexistent{i}")).chain((0..300).map(|i| format!(" -lq{i}"))).collect();
    for (n, extra) in [" -optf f0.opts".to_owned(), lookups].iter().enumerate() {
        let out = TempDir::new("sec-bounds-out");
        let link = inv(&format!("{LINK}{extra}"), work.path(), &out);
        let expected = run(&real_nvlink(), &link, &[]);
        let actual = run(&shim(), &link, &d.fallback_env());
        let cmp = compare::runs(&expected, &actual);
        assert!(cmp.problems.is_empty() && cmp.identical, "{extra:.40}: {:?}", cmp.problems);
        assert_eq!(d.stat("fallbacks"), n as u64 + 1, "{extra:.40}: not left to nvlink: {}", d.stats());
    }
}

/// The environment of a shim of the token file's other token.
fn other_token_env(pki: &Pki, addr: &str, fallback: &str) -> Vec<(String, String)> {
    let mut env = pki.shim_env(addr, fallback);
    for (k, v) in &mut env {
        if k == paths::ENV_TOKEN_FILE {
            *v = pki.file("other-client-token");
        }
    }
    env
}

/// Links over TCP with [`TOKEN`] that never answer the daemon: `per_connection`
/// on each of `connections` HTTP/2 connections, each link of two inputs,
/// announced (by digests the daemon holds no blob of) or not (asked for by
/// path). Their request streams (dropped: the links end) and how many
/// streams the daemon has opened so far.
fn silent_links(
    rt: &tokio::runtime::Runtime,
    pki: &Pki,
    port: u16,
    connections: usize,
    per_connection: usize,
    announce: bool,
) -> (Vec<tokio::sync::mpsc::Sender<ClientMessage>>, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use nvlinkd_proto::v1::AnnouncedFile;
    use std::sync::atomic::{AtomicUsize, Ordering};
    let opened = std::sync::Arc::new(AtomicUsize::new(0));
    let senders = rt.block_on(async {
        let mut senders = Vec::new();
        for c in 0..connections {
            let channel = tls_channel(pki, port).await;
            for i in 0..per_connection {
                let dir = format!("/silent/{c}/{i}");
                let files = ["a.o", "b.o"]
                    .iter()
                    .filter(|_| announce)
                    .map(|f| AnnouncedFile {
                        path: format!("{dir}/{f}"),
                        exists: true,
                        is_dir: false,
                        size: 1 << 20,
                        blake3: blake3::hash(format!("{dir}/{f}").as_bytes()).as_bytes().to_vec(),
                    })
                    .collect();
                let args = ["--arch=sm_90", "a.o", "b.o", "-o", "out.cubin"].map(String::from).to_vec();
                let start = Start { args, cwd: dir, files, ..Default::default() };
                let (tx, rx) = tokio::sync::mpsc::channel(1);
                tx.send(ClientMessage { msg: Some(client_message::Msg::Start(start)) }).await.unwrap();
                senders.push(tx);
                let (mut client, opened) = (NvlinkdClient::new(channel.clone()), opened.clone());
                tokio::spawn(async move {
                    let request = with_token(tokio_stream::wrappers::ReceiverStream::new(rx), TOKEN);
                    if let Ok(r) = client.link(request).await {
                        opened.fetch_add(1, Ordering::Relaxed);
                        // Reads what the daemon asks and never answers.
                        let mut answers = r.into_inner();
                        while let Ok(Some(_)) = answers.message().await {}
                    }
                });
            }
        }
        senders
    });
    (senders, opened)
}

/// Remote links that announce nothing and never answer the daemon's reads by
/// path: each waits for its replies (6 s) on its own thread, which its slot
/// bounds, never on the pool that decodes and digests every link's inputs
/// (rayon's, 2 threads on this machine). A local link meanwhile is prompt.
#[test]
fn remote_links_that_never_answer_leave_local_links_prompt() {
    use std::time::Instant;
    let pki = Pki::new();
    let (d, port) = tls_daemon(&pki, &["--max-remote-links", "8", "--reply-timeout", "6s"]);
    let out = TempDir::new("sec-silent-out");
    let link = inv(LINK, corpus::dir(), &out);
    let expected = run(&real_nvlink(), &link, &[]);
    assert_same(&expected, &run(&shim(), &link, &d.shim_env()), "a local link before");
    let rt = runtime();
    // The token's four slots (half of eight), all waiting for replies.
    let (silent, _) = silent_links(&rt, &pki, port, 1, 4, false);
    d.wait_stat("in_flight", 4);
    let t0 = Instant::now();
    let local = run(&shim(), &link, &d.shim_env());
    let took = t0.elapsed();
    eprintln!("a local link beside four silent remote links: {took:?}");
    assert_same(&expected, &local, "a local link beside silent remote links");
    assert!(took < Duration::from_secs(3), "the local link took {took:?} beside silent remote links");
    drop(silent);
    rt.shutdown_background();
}

/// A token holder's stream flood: 8 connections with 80 links each, every
/// one announcing two input files it never sends and answering nothing
/// (issue: each held a blocking thread while it waited, the pool filled and
/// local links waited ~50 s). Meanwhile a local link through the shim is
/// answered promptly with nvlink's bytes, and so is the other token's remote
/// link; the flood's links past its token's slots are refused after the
/// wait (`remote_links_refused`); once the flood ends, its token's remote
/// links are served again.
#[test]
fn a_stream_flood_over_tcp_leaves_local_links_prompt() {
    use std::sync::atomic::Ordering;
    use std::time::Instant;
    let pki = Pki::new();
    let (d, port) = tls_daemon(&pki, &["--max-remote-links", "8", "--reply-timeout", "6s"]);
    let addr = format!("https://127.0.0.1:{port}");
    let out = TempDir::new("sec-sflood-out");
    let link = inv(LINK, corpus::dir(), &out);
    let expected = run(&real_nvlink(), &link, &[]);
    // Computed once before: during the flood the daemon's own delay is measured, not the toolkit's.
    assert_same(&expected, &run(&shim(), &link, &d.shim_env()), "a local link before the flood");

    let rt = runtime();
    let (flood, opened) = silent_links(&rt, &pki, port, 8, 80, true);
    // Every connection has its streams open, and the daemon has their Starts.
    let deadline = Instant::now() + Duration::from_secs(30);
    while opened.load(Ordering::Relaxed) < 8 * 16
        || (d.stat_or_zero("remote_links_waiting") == 0 && d.stat_or_zero("requests") < 2)
    {
        assert!(
            Instant::now() < deadline,
            "the flood did not arrive: {} streams, {}",
            opened.load(Ordering::Relaxed),
            d.stats()
        );
        std::thread::sleep(Duration::from_millis(20));
    }

    let t0 = Instant::now();
    let local = run(&shim(), &link, &d.shim_env());
    let local_took = t0.elapsed();
    assert_same(&expected, &local, "a local link during the flood");
    let t0 = Instant::now();
    let other = run(&shim(), &link, &other_token_env(&pki, &addr, "never"));
    let other_took = t0.elapsed();
    assert_same(&expected, &other, "the other token's remote link during the flood");
    eprintln!("during the flood: a local link took {local_took:?}, the other token's remote link {other_took:?}");
    assert!(local_took < Duration::from_secs(3), "the local link took {local_took:?} during the flood");
    assert!(other_took < Duration::from_secs(3), "the other token's link took {other_took:?} during the flood");
    // The flood's links past its token's half of the slots are refused after the wait.
    d.wait_stat("remote_links_refused", 1);
    assert!(d.stat("remote_links") <= 8, "{}", d.stats());

    // The flood ends (its connections close): its slots come back at once.
    drop(flood);
    rt.shutdown_background();
    let deadline = Instant::now() + Duration::from_secs(30);
    while d.stat("remote_links") + d.stat("remote_links_waiting") > 0 {
        assert!(Instant::now() < deadline, "the flood's slots were not given back: {}", d.stats());
        std::thread::sleep(Duration::from_millis(20));
    }
    let remote = run(&shim(), &link, &remote_env(&pki, &addr));
    assert_same(&expected, &remote, "a remote link of the flood's token after the flood");
    assert!(d.answers(), "the daemon died");
}

/// Slots per caller: with `--max-remote-links 2` each of the two tokens has
/// one. While a link of a token holds its slot (kept 6 s by the test hook),
/// the same token's next links wait `--reply-timeout` (2 s) and are refused
/// (`RESOURCE_EXHAUSTED`, `remote_links_refused`): the shim then runs the
/// real nvlink (`NVLINKD_FALLBACK=auto`: nvlink's bytes) or fails saying why
/// (`never`, writing nothing). The other token's link takes the other slot
/// and is served.
#[test]
fn remote_links_past_their_tokens_slots_are_refused_and_run_the_real_nvlink() {
    let pki = Pki::new();
    let (d, port) = nvlinkd_tests::remote::tls_daemon_env(
        &pki,
        &["--max-remote-links", "2", "--reply-timeout", "2s"],
        &[("NVLINKD_TEST_SLOW_LINK_MS", "6000")],
    );
    let addr = format!("https://127.0.0.1:{port}");
    let outs: Vec<TempDir> = (0..4).map(|i| TempDir::new(&format!("sec-slots-{i}"))).collect();
    let link = |i: usize| inv(LINK, corpus::dir(), &outs[i]);
    let expected = run(&real_nvlink(), &link(0), &[]);
    std::thread::scope(|s| {
        let holder = s.spawn(|| run(&shim(), &link(0), &pki.shim_env(&addr, "never")));
        // Its slot taken, it is in the linker (sleeping).
        d.wait_stat("in_flight", 1);
        let other = s.spawn(|| run(&shim(), &link(1), &other_token_env(&pki, &addr, "never")));
        let auto = s.spawn(|| run(&shim(), &link(2), &pki.shim_env(&addr, "auto")));
        let never = s.spawn(|| run(&shim(), &link(3), &pki.shim_env(&addr, "never")));
        let (auto, never) = (auto.join().unwrap(), never.join().unwrap());
        assert_same(&expected, &auto, "a refused link run by the real nvlink");
        assert_ne!(never.code, 0, "a link past its token's slots was served");
        let stderr = String::from_utf8_lossy(&never.stderr);
        assert!(stderr.contains("as many remote links as it may"), "{stderr}");
        assert!(never.files.is_empty(), "output written without a daemon's answer");
        assert_eq!(d.stat("remote_links_refused"), 2, "{}", d.stats());
        assert_same(&expected, &holder.join().unwrap(), "the link holding its token's slot");
        assert_same(&expected, &other.join().unwrap(), "the other token's link");
    });
    assert_eq!(d.stat("requests"), 2, "only the two links with a slot reached the linker");
    assert_eq!(d.stat("fallbacks"), 0);
    // Per token, by name (the Pki's tokens are bare: named by their lines,
    // OTHER_TOKEN's 3 and TOKEN's 4).
    let tokens = &d.stats()["tokens"];
    assert_eq!((tokens["token-4"]["links"].as_u64(), tokens["token-4"]["refused"].as_u64()), (Some(1), Some(2)));
    assert_eq!((tokens["token-3"]["links"].as_u64(), tokens["token-3"]["refused"].as_u64()), (Some(1), Some(0)));
}

/// Connections that finish the TLS handshake and then make no authenticated
/// call (a call with a wrong token is none) are closed 10 s after their
/// handshake: held open, they filled the per-address cap and kept every shim
/// of that address out. The closings are counted
/// (`tcp_closed_unauthenticated`) and logged once per 10 s; then a genuine
/// shim links.
#[test]
fn connections_that_never_authenticate_are_closed() {
    use std::time::Instant;
    let pki = Pki::new();
    // One address gets a quarter of 8: two connections.
    let (d, port) = tls_daemon(&pki, &["--max-connections", "8"]);
    let addr = format!("https://127.0.0.1:{port}");
    let out = TempDir::new("sec-unauth-out");
    let link = inv(LINK, corpus::dir(), &out);
    let expected = run(&real_nvlink(), &link, &[]);
    let rt = runtime();
    let t0 = Instant::now();
    let held = rt.block_on(async {
        let quiet = tls_channel(&pki, port).await;
        let wrong = tls_channel(&pki, port).await;
        let e = NvlinkdClient::new(wrong.clone()).stats(with_token(StatsRequest {}, "wrong")).await.unwrap_err();
        assert_eq!(e.code(), Code::Unauthenticated, "{e:?}");
        (quiet, wrong)
    });
    assert_eq!(d.stat("tcp_connections"), 2, "{}", d.stats());
    // Meanwhile this address has no connection left for a shim.
    let refused = run(&shim(), &link, &remote_env(&pki, &addr));
    assert_ne!(refused.code, 0, "a shim linked past the per-address cap");
    let deadline = t0 + Duration::from_secs(20);
    while d.stat("tcp_connections") > 0 {
        assert!(Instant::now() < deadline, "connections that never authenticated were kept: {}", d.stats());
        std::thread::sleep(Duration::from_millis(20));
    }
    let took = t0.elapsed();
    eprintln!("unauthenticated connections closed after {took:?}");
    assert!(took >= Duration::from_secs(9), "closed after {took:?}, before their 10 s");
    assert_eq!(d.stat("tcp_closed_unauthenticated"), 2, "{}", d.stats());
    let lines = d.wait_log("no authenticated call within 10s", 1);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(lines[0].contains("peer=127.0.0.1:"), "{lines:?}");
    let remote = run(&shim(), &link, &remote_env(&pki, &addr));
    assert_same(&expected, &remote, "a shim after the unauthenticated connections were closed");
    drop(held);
}

/// A client that keeps reconnecting from eight addresses and never shakes
/// hands held every slot of `--listen`, and every remote shim was refused. A
/// quarter of the slots is now reserved for addresses that made an
/// authenticated call lately: the flood holds the rest, and a token holder
/// that linked before still links, byte for byte nvlink's. While the
/// unreserved slots are more than half taken, the flood's new connections
/// have 1 s for their handshake instead of 10 s.
#[test]
fn a_flood_from_many_addresses_leaves_room_for_a_token_holder() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let pki = Pki::new();
    // 16 slots: 4 per address, the last 4 reserved.
    let (d, port) = tls_daemon(&pki, &["--max-connections", "16"]);
    let addr = format!("https://127.0.0.1:{port}");
    let out = TempDir::new("sec-reserve-out");
    let link = inv(LINK, corpus::dir(), &out);
    let expected = run(&real_nvlink(), &link, &[]);
    // The token holder links from 127.0.0.1 before the flood.
    assert_same(&expected, &run(&shim(), &link, &remote_env(&pki, &addr)), "a remote link before the flood");
    // The flood: 3 connections from each of 127.0.0.2..9, each held until the
    // daemon closes it and then opened again (24 wanted, past the 16).
    let rt = runtime();
    let stop = Arc::new(AtomicBool::new(false));
    for source in 2..10u8 {
        for _ in 0..3 {
            let stop = stop.clone();
            rt.spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let s = tokio::net::TcpSocket::new_v4().unwrap();
                    s.bind(std::net::SocketAddr::from(([127, 0, 0, source], 0))).expect("bind a loopback address");
                    if let Ok(c) = s.connect(([127, 0, 0, 1], port).into()).await {
                        let mut buf = [0u8; 64];
                        loop {
                            let _ = c.readable().await;
                            match c.try_read(&mut buf) {
                                Ok(0) => break,
                                Err(e) if e.kind() != std::io::ErrorKind::WouldBlock => break,
                                _ => {}
                            }
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            });
        }
    }
    let t0 = Instant::now();
    // The flood at its cap: connections held, and the others refused.
    while d.stat("tcp_connections") < 12 || d.stat("tcp_connections_refused") < 8 {
        assert!(t0.elapsed() < Duration::from_secs(5), "the flood did not reach the cap: {}", d.stats());
        std::thread::sleep(Duration::from_millis(20));
    }
    let remote = run(&shim(), &link, &remote_env(&pki, &addr));
    assert_same(&expected, &remote, "a token holder's link during the flood");
    assert_eq!(d.stat("requests"), 2, "the daemon did not answer the link: {}", d.stats());
    assert!(d.stat("tcp_connections_refused_reserved") > 0, "{}", d.stats());
    // The flood's connections past half the unreserved slots were hurried:
    // closed well before the 10 s handshake time.
    while d.stat("tls_handshake_failures") == 0 {
        assert!(t0.elapsed() < Duration::from_secs(8), "no silent connection was hurried: {}", d.stats());
        std::thread::sleep(Duration::from_millis(50));
    }
    stop.store(true, Ordering::Relaxed);
    rt.shutdown_background();
    assert!(d.answers(), "the daemon died");
}

/// The metrics port has no authentication and shares the daemon's open-file
/// limit: a flood of silent connections past that limit leaves the daemon
/// idle (it spun at 87% CPU) and local links prompt (a cached link took 2 s).
#[test]
fn a_flood_of_the_metrics_port_starves_nothing() {
    use std::net::TcpStream;
    use std::time::Instant;
    let port = free_port();
    let d = Daemon::start_with_file_limit(&["--metrics-listen", &format!("127.0.0.1:{port}")], 256);
    let flood: Vec<TcpStream> = (0..400)
        .filter_map(|_| TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), Duration::from_secs(1)).ok())
        .collect();
    assert!(flood.len() > 256, "the flood could not pass the file limit: {} connections", flood.len());
    // At once, while the silent connections hold every descriptor.
    let pid = d.pid().expect("daemon pid");
    let ticks = nvlinkd_tests::daemon::cpu_ticks_over(pid, Duration::from_secs(2));
    assert!(ticks < 30, "the daemon used {ticks} ticks of CPU in 2 s under the flood");
    let out = TempDir::new("sec-mflood-out");
    let link = inv(LINK, corpus::dir(), &out);
    let expected = run(&real_nvlink(), &link, &[]);
    let t0 = Instant::now();
    assert_same(&expected, &run(&shim(), &link, &d.shim_env()), "a local link during the flood");
    assert!(t0.elapsed() < Duration::from_secs(5), "the local link took {:?}", t0.elapsed());
    drop(flood);
    assert!(d.answers(), "the daemon died");
}

/// `field` of `/proc/<pid>/status` (`VmHWM`, `VmRSS`), in bytes.
fn proc_status_bytes(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with(&format!("{field}:"))).unwrap_or_else(|| panic!("no {field}"));
    let kib: u64 = line.split_whitespace().nth(1).and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("{line}"));
    kib << 10
}

/// A client with [`TOKEN`] whose link reads `a.o` in `/flood/<tag>`: it
/// answers every read of it with pieces of 1 MiB, `flood` bytes in all before
/// the last piece (and `b.o` and anything else with "not found"). With
/// `announce`, `a.o` is announced by a digest no blob has, so the daemon asks
/// for it at the start (its blob's flight) and again by path when the link
/// reads it. The daemon's result, once it comes.
async fn flooding_link(pki: &Pki, port: u16, tag: &str, announce: bool, flood: usize) -> LinkResult {
    use nvlinkd_proto::v1::{
        file_error, file_reply, file_request, server_message, AnnouncedFile, FileError, FileReply,
    };
    let dir = format!("/flood/{tag}");
    let a = format!("{dir}/a.o");
    let files = if announce {
        let digest = blake3::hash(a.as_bytes()).as_bytes().to_vec();
        let size = flood as u64 + (1 << 20);
        vec![AnnouncedFile { path: a.clone(), exists: true, is_dir: false, size, blake3: digest }]
    } else {
        Vec::new()
    };
    let args = ["--arch=sm_90", "a.o", "b.o", "-o", "out.cubin"].map(String::from).to_vec();
    let start = Start { args, cwd: dir, files, ..Default::default() };
    let mut client = NvlinkdClient::new(tls_channel(pki, port).await);
    let (tx, rx) = tokio::sync::mpsc::channel::<ClientMessage>(4);
    tx.send(ClientMessage { msg: Some(client_message::Msg::Start(start)) }).await.unwrap();
    let mut inbound =
        client.link(with_token(tokio_stream::wrappers::ReceiverStream::new(rx), TOKEN)).await.unwrap().into_inner();
    let piece = bytes::Bytes::from(vec![0x5a; 1 << 20]);
    let mut floods = Vec::new();
    let result = loop {
        let m = match inbound.message().await {
            Ok(Some(m)) => m,
            other => panic!("{tag}: the stream ended without a result: {other:?}"),
        };
        let req = match m.msg {
            Some(server_message::Msg::File(req)) => req,
            Some(server_message::Msg::Result(r)) => break r,
            _ => continue,
        };
        let file = |result| ClientMessage {
            msg: Some(client_message::Msg::File(FileReply { id: req.id, result: Some(result), more: false })),
        };
        if req.path == a && req.op() == file_request::Op::Read {
            let (tx, piece, id) = (tx.clone(), piece.clone(), req.id);
            floods.push(tokio::spawn(async move {
                for sent in (0..=flood).step_by(1 << 20) {
                    let reply =
                        FileReply { id, result: Some(file_reply::Result::Data(piece.clone())), more: sent < flood };
                    if tx.send(ClientMessage { msg: Some(client_message::Msg::File(reply)) }).await.is_err() {
                        return;
                    }
                }
            }));
            continue;
        }
        let missing =
            FileError { kind: file_error::Kind::NotFound as i32, message: "No such file or directory".into() };
        let _ = tx.send(file(file_reply::Result::Error(missing))).await;
    };
    floods.iter().for_each(|f| f.abort());
    result
}

/// A client with [`TOKEN`] whose `Start` announces `n` distinct 8-byte files
/// `/tiny/<tag>/<i>`, its command line naming only `/tiny/<tag>/0.o`; it
/// answers every read with the file's bytes. The daemon's answer (a result,
/// or the status refusing the link) and the number of reads it asked for.
async fn announcing_link(pki: &Pki, port: u16, tag: &str, n: usize) -> (Result<LinkResult, tonic::Status>, usize) {
    use nvlinkd_proto::v1::{file_reply, server_message, AnnouncedFile, FileReply};
    let dir = format!("/tiny/{tag}");
    let bytes = |i: usize| bytes::Bytes::from((i as u64).to_le_bytes().to_vec());
    let name = |i: usize| if i == 0 { format!("{dir}/0.o") } else { format!("{dir}/{i}") };
    let files = (0..n)
        .map(|i| AnnouncedFile {
            path: name(i),
            exists: true,
            is_dir: false,
            size: 8,
            blake3: blake3::hash(&bytes(i)).as_bytes().to_vec(),
        })
        .collect();
    let args = ["--arch=sm_90", "0.o", "-o", "out.cubin"].map(String::from).to_vec();
    let start = Start { args, cwd: dir.clone(), files, ..Default::default() };
    let mut client = NvlinkdClient::new(tls_channel(pki, port).await).max_encoding_message_size(64 << 20);
    let (tx, rx) = tokio::sync::mpsc::channel::<ClientMessage>(4);
    tx.send(ClientMessage { msg: Some(client_message::Msg::Start(start)) }).await.unwrap();
    let mut inbound = match client.link(with_token(tokio_stream::wrappers::ReceiverStream::new(rx), TOKEN)).await {
        Ok(r) => r.into_inner(),
        Err(status) => return (Err(status), 0),
    };
    let mut reads = 0;
    loop {
        let m = match inbound.message().await {
            Ok(Some(m)) => m,
            Ok(None) => panic!("{tag}: the stream ended without a result"),
            Err(status) => return (Err(status), reads),
        };
        let req = match m.msg {
            Some(server_message::Msg::File(req)) => req,
            Some(server_message::Msg::Result(r)) => return (Ok(r), reads),
            _ => continue,
        };
        reads += 1;
        let i = (0..n).find(|i| name(*i) == req.path).unwrap_or(0);
        let reply = FileReply { id: req.id, result: Some(file_reply::Result::Data(bytes(i))), more: false };
        let _ = tx.send(ClientMessage { msg: Some(client_message::Msg::File(reply)) }).await;
    }
}

/// Blob files under the daemon's cache directory.
fn blob_files(d: &Daemon) -> usize {
    let shards = std::fs::read_dir(d.cache_dir().join("blobs/v2")).into_iter().flatten().flatten();
    shards.map(|s| std::fs::read_dir(s.path()).map(|f| f.count()).unwrap_or(0)).sum()
}

/// Each blob a remote shim announces is a file in the daemon's store: a
/// `Start` announcing tens of thousands of tiny files the link never reads
/// once filled the store's filesystem with as many files (and its inodes),
/// far beyond what the store accounted. A `Start` announcing more than
/// `MAX_ANNOUNCED_FILES` is refused (`RESOURCE_EXHAUSTED`: the shim runs the
/// real nvlink) before anything is asked; of one within the bound only the
/// files the command line names are fetched when the link starts, the rest
/// only if the link reads them. Honest remote links are served meanwhile.
#[test]
fn announced_files_the_link_never_reads_are_never_fetched() {
    let pki = Pki::new();
    let (d, port) = secure_daemon(&pki);
    let rt = runtime();
    let (refused, reads) = rt.block_on(announcing_link(&pki, port, "many", nvlinkd_proto::MAX_ANNOUNCED_FILES + 1));
    let status = refused.expect_err("a Start past the bound was taken");
    assert_eq!((status.code(), reads), (Code::ResourceExhausted, 0), "{status:?}");
    let (answered, reads) = rt.block_on(announcing_link(&pki, port, "unread", 4000));
    assert!(answered.is_ok(), "{answered:?}");
    assert!(reads <= 1, "{reads} announced files asked for");
    assert!(blob_files(&d) <= 1, "{} blob files stored", blob_files(&d));
    // An honest remote link.
    let out = TempDir::new("sec-tiny-out");
    let link = inv(LINK, corpus::dir(), &out);
    let expected = run(&real_nvlink(), &link, &[]);
    assert_same(&expected, &run(&shim(), &link, &remote_env(&pki, &format!("https://127.0.0.1:{port}"))), "remote");
    assert_eq!(blob_files(&d), 3, "the honest link's two inputs and the tiny one");
}

/// Remote shims' replies to reads by path are gathered in the daemon's
/// memory; one link may read 8 GiB, so clients answering with huge files
/// grew the daemon by as much, together. Four clients over TLS, each answering
/// its link's read of `a.o` with 256 MiB of pieces (three by path, one
/// announced, so that its blob's flight is asked for first), against `--max-reply-memory 64MiB`: each read is refused (a
/// fallback naming the bound, `reply_memory_refused`), the daemon's peak
/// resident memory grows by at most the bound and a margin, what the links
/// held is given back when they end (`reply_memory_bytes` 0), and local and
/// remote links meanwhile and after are nvlink's. (Before the bound the
/// daemon grew by 1766 MiB here.) The margin is what the four connections'
/// HTTP/2 windows may hold unread, and 32 MiB.
#[test]
fn file_replies_past_the_reply_memory_are_refused_and_the_daemon_stays_small() {
    const BOUND: u64 = 64 << 20;
    const MARGIN: u64 = 4 * (32 << 20) + (32 << 20);
    const FLOOD: usize = 256 << 20;
    let pki = Pki::new();
    let (d, port) = tls_daemon(&pki, &["--max-reply-memory", "64MiB", "--max-remote-links", "8"]);
    let addr = format!("https://127.0.0.1:{port}");
    let out = TempDir::new("sec-replymem-out");
    let link = inv(LINK, corpus::dir(), &out);
    let expected = run(&real_nvlink(), &link, &[]);
    assert_same(&expected, &run(&shim(), &link, &d.shim_env()), "a local link before");
    assert_same(&expected, &run(&shim(), &link, &remote_env(&pki, &addr)), "a remote link before");
    let pid = d.pid().unwrap();
    let before = proc_status_bytes(pid, "VmHWM");

    let rt = runtime();
    let pki_ref = &pki;
    let results = rt.block_on(async {
        let flooding = |tag: &'static str| async move {
            (tag, flooding_link(pki_ref, port, tag, tag == "announced", FLOOD).await)
        };
        // A local link while the replies flood in.
        let (local_link, env) = (link.clone(), d.shim_env());
        let local = tokio::task::spawn_blocking(move || run(&shim(), &local_link, &env));
        let (p0, p1, p2, announced, local) =
            tokio::join!(flooding("p0"), flooding("p1"), flooding("p2"), flooding("announced"), local);
        assert_same(&expected, &local.unwrap(), "a local link during the flood");
        [p0, p1, p2, announced]
    });
    let after = proc_status_bytes(pid, "VmHWM");
    eprintln!(
        "daemon VmHWM: {} MiB before the flood, {} MiB after ({} MiB more; bound {} MiB)",
        before >> 20,
        after >> 20,
        after.saturating_sub(before) >> 20,
        BOUND >> 20
    );
    assert!(after <= before + BOUND + MARGIN, "the daemon grew by {} MiB", (after - before) >> 20);
    for (tag, r) in &results {
        assert!(r.fallback && r.fallback_reason.contains("--max-reply-memory"), "{tag}: {r:?}");
    }
    assert!(d.stat("reply_memory_refused") >= 4, "{}", d.stats());
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while d.stat("reply_memory_bytes") > 0 {
        assert!(std::time::Instant::now() < deadline, "the links' replies were kept: {}", d.stats());
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_same(&expected, &run(&shim(), &link, &d.shim_env()), "a local link after");
    let out2 = TempDir::new("sec-replymem-out2");
    let link2 = inv(LINK, corpus::dir(), &out2);
    assert_same(&expected, &run(&shim(), &link2, &remote_env(&pki, &addr)), "a remote link after");
    assert!(d.answers(), "the daemon died");
}

/// The audit of remote links (issue "a farm an operator can run", item 2):
/// one line per remote link at info level naming its peer, its token's name
/// (`name:secret` in the token file; a bare secret is named after its line),
/// the engine, the cache result, the bytes each way, the time and the exit
/// status, never the secret; and per-token figures in `stats --json` that
/// move for their own token only.
#[test]
fn a_remote_link_is_audited_by_its_tokens_name_and_never_its_secret() {
    let pki = Pki::new();
    pki.replace("tokens", format!("# farm\nci:{TOKEN}\n{OTHER_TOKEN}\n").as_bytes());
    let (d, port) = tls_daemon(&pki, &[]);
    let addr = format!("https://127.0.0.1:{port}");
    let out = TempDir::new("sec-audit-out");
    let link = inv(LINK, corpus::dir(), &out);
    let expected = run(&real_nvlink(), &link, &[]);
    let tokens = || d.stats()["tokens"].clone();
    assert_eq!(tokens()["ci"]["links"], 0, "a token in force has figures from the start: {}", tokens());

    assert_same(&expected, &run(&shim(), &link, &remote_env(&pki, &addr)), "the link of ci");
    let lines = d.wait_log("remote link done", 1);
    assert_eq!(lines.len(), 1, "{lines:?}");
    let line = &lines[0];
    for field in ["INFO", "peer=127.0.0.1:", "token=ci ", "engine=in_process", "cache=miss", "exit=0", "ms="] {
        assert!(line.contains(field), "no {field} in {line}");
    }
    let inputs: u64 = ["accumulate.o", "scale.o"].iter().map(|f| corpus::dir().join(f).metadata().unwrap().len()).sum();
    let output = std::fs::metadata(out.path().join("out.cubin")).unwrap().len();
    assert!(line.contains(&format!("received={inputs} ")), "{line}");
    let log = d.log();
    assert!(!log.contains(TOKEN) && !log.contains(OTHER_TOKEN), "a secret in the log:\n{log}");
    assert_eq!(log.matches("link done").count(), 1, "one line per remote link:\n{log}");
    let ci = tokens()["ci"].clone();
    assert_eq!((ci["links"].as_u64(), ci["refused"].as_u64()), (Some(1), Some(0)), "{ci}");
    assert_eq!(ci["bytes_received"].as_u64(), Some(inputs), "{ci}");
    assert!(ci["bytes_sent"].as_u64().unwrap() >= output, "{ci}");

    // The other token, a bare secret on line 3: its own name, its own figures.
    assert_same(&expected, &run(&shim(), &link, &other_token_env(&pki, &addr, "never")), "the other token's link");
    let lines = d.wait_log("remote link done", 2);
    assert!(lines[1].contains("token=token-3 ") && lines[1].contains("cache=hit"), "{lines:?}");
    let t = tokens();
    assert_eq!((t["ci"]["links"].as_u64(), t["token-3"]["links"].as_u64()), (Some(1), Some(1)), "{t}");
    assert_eq!(t["token-3"]["bytes_received"].as_u64(), Some(0), "a whole-link hit reads no input: {t}");
    // A local link keeps its own line and counts for no token.
    assert_same(&expected, &run(&shim(), &link, &d.shim_env()), "a local link");
    d.wait_log("link done args=", 1);
    assert_eq!(d.log().matches("remote link done").count(), 2);
    assert_eq!(tokens(), t, "a local link moved a token's figures");
}

/// A gRPC codec that sends raw bytes (here: no protobuf message at all) and
/// reads nothing of the answer.
#[derive(Default)]
struct RawCodec;

struct RawBytes;

impl tonic::codec::Encoder for RawBytes {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn encode(&mut self, item: Vec<u8>, dst: &mut tonic::codec::EncodeBuf<'_>) -> Result<(), tonic::Status> {
        use bytes::BufMut;
        dst.put_slice(&item);
        Ok(())
    }
}

impl tonic::codec::Decoder for RawBytes {
    type Item = ();
    type Error = tonic::Status;
    fn decode(&mut self, src: &mut tonic::codec::DecodeBuf<'_>) -> Result<Option<()>, tonic::Status> {
        use bytes::Buf;
        src.advance(src.remaining());
        Ok(Some(()))
    }
}

impl tonic::codec::Codec for RawCodec {
    type Encode = Vec<u8>;
    type Decode = ();
    type Encoder = RawBytes;
    type Decoder = RawBytes;
    fn encoder(&mut self) -> RawBytes {
        RawBytes
    }
    fn decoder(&mut self) -> RawBytes {
        RawBytes
    }
}

/// A caller without a token is refused on the call's headers, before the
/// daemon reads (and inflates) its body: a zstd message of 4 MiB that is no
/// protobuf at all gets UNAUTHENTICATED without a token (had the body been
/// decoded first, as tonic does for a unary call before its handler runs,
/// the answer would be the decoding error, and every such stream would hold
/// 4 MiB); with a valid token the same call reaches the decoder.
#[test]
fn a_call_without_a_token_is_refused_before_its_body_is_read() {
    let pki = Pki::new();
    let (d, port) = secure_daemon(&pki);
    let garbage = vec![0xff_u8; 4 << 20];
    let call = |token: Option<&str>| {
        runtime().block_on(async {
            let channel = tls_channel(&pki, port).await;
            let mut grpc = tonic::client::Grpc::new(channel).send_compressed(tonic::codec::CompressionEncoding::Zstd);
            grpc.ready().await.unwrap();
            let request = match token {
                Some(t) => with_token(garbage.clone(), t),
                None => tonic::Request::new(garbage.clone()),
            };
            let path = http::uri::PathAndQuery::from_static("/nvlinkd.v1.Nvlinkd/Stats");
            grpc.unary(request, path, RawCodec).await.map(|_| ()).unwrap_err()
        })
    };
    let refused = call(None);
    assert_eq!(refused.code(), Code::Unauthenticated, "{refused:?}");
    assert_eq!(d.stat("auth_failures"), 1);
    let decoded = call(Some(TOKEN));
    assert_ne!(decoded.code(), Code::Unauthenticated, "the valid token was refused: {decoded:?}");
    assert_eq!(d.stat("auth_failures"), 1);
}

/// A remote caller learns why its link fell back, not where the daemon keeps
/// its toolkit or cache: a daemon whose toolkit changed on disk falls back
/// with a reason naming that toolkit (which the shim prints under
/// `NVLINKD_FALLBACK=never`), the daemon's paths named by their role.
#[test]
fn a_remote_fallback_reason_names_no_path_of_the_daemon() {
    let pki = Pki::new();
    let host = TempDir::new("sec-redact-cuda");
    let home = host.path().join("cuda");
    nvlinkd_tests::env::install_toolkit_copy(&home);
    let h = home.display().to_string();
    let (d, port) = tls_daemon(&pki, &["--cuda-home", &h]);
    let out = TempDir::new("sec-redact-out");
    let link = inv(LINK, corpus::dir(), &out);
    let env = remote_env(&pki, &format!("https://127.0.0.1:{port}"));
    assert_eq!(run(&shim(), &link, &env).code, 0, "a first link");
    // Nor is a guess confirmed: a caller's own text naming one of the
    // daemon's paths comes back as the caller wrote it, as a wrong guess does
    // (redacted, it told the caller it had guessed right).
    let cache = d.cache_dir();
    let mut shapes = Vec::new();
    for guess in [h.clone(), cache.display().to_string(), "/not/the/daemons/dir".to_owned()] {
        let args =
            format!("--arch=sm_90 --preserve-relocs -L{guess}/../../../../../../../.. accumulate.o -o {{OUT}}/x.cubin");
        let r = run(&shim(), &inv(&args, corpus::dir(), &out), &env);
        shapes.push(String::from_utf8_lossy(&r.stderr).replace(&guess, "GUESS"));
    }
    assert!(shapes[2].contains("GUESS"), "{shapes:#?}");
    assert!(shapes[0] == shapes[2] && shapes[1] == shapes[2], "a guess is told apart: {shapes:#?}");
    // A patched ptxas (one byte more): the daemon's toolkit changed.
    let mut f = std::fs::OpenOptions::new().append(true).open(home.join("bin/ptxas")).unwrap();
    std::io::Write::write_all(&mut f, b"\0").unwrap();
    drop(f);
    std::thread::sleep(Duration::from_millis(1100));
    let r = run(&shim(), &link, &env);
    let stderr = String::from_utf8_lossy(&r.stderr);
    assert!(r.code != 0 && stderr.contains("changed on disk"), "not the fallback expected: {stderr}");
    for path in [home.to_string_lossy(), cache.to_string_lossy()] {
        assert!(!stderr.contains(path.as_ref()), "the reason names {path}: {stderr}");
    }
    assert!(stderr.contains("<toolkit>"), "{stderr}");
}

/// A routed remote link naming an options file: the parse reads it in place
/// and keeps its options, not its name, so the sandbox lacked it and nvlink
/// there answered "Could not open options file", which was cached and served
/// to a local user with the same command line. Such a link is not mirrored:
/// the caller's nvlink links it, and the local link is nvlink's.
#[test]
fn a_routed_remote_link_with_an_options_file_caches_no_error() {
    let pki = Pki::new();
    let (d, port) = secure_daemon(&pki);
    let work = TempDir::new("sec-optf");
    for o in ["accumulate.o", "scale.o"] {
        std::fs::copy(corpus::dir().join(o), work.path().join(o)).unwrap();
    }
    std::fs::write(work.path().join("objs.opts"), "accumulate.o scale.o\n").unwrap();
    let out = TempDir::new("sec-optf-out");
    // (-preserve-relocs: a link the real nvlink serves.)
    let link = inv("--arch=sm_90 -preserve-relocs -optf objs.opts -o {OUT}/out.cubin", work.path(), &out);
    let expected = run(&real_nvlink(), &link, &[]);
    assert_eq!(expected.code, 0, "{}", String::from_utf8_lossy(&expected.stderr));
    let remote = pki.shim_env(&format!("https://127.0.0.1:{port}"), "auto");
    assert_same(&expected, &run(&shim(), &link, &remote), "the remote link");
    assert_same(&expected, &run(&shim(), &link, &d.shim_env()), "a local link of the same command line");
}

/// A runtime directory another user made first (`/tmp/nvlinkd-$UID` before
/// this user's first link): the shim neither uses nor replaces it, links with
/// the real nvlink (its output, status and messages), and says why on stderr
/// with the fix, on every link, instead of silently never being fast.
#[test]
fn a_runtime_directory_another_user_made_is_refused_with_a_warning() {
    use std::os::unix::fs::PermissionsExt;
    let xdg = TempDir::new("sec-rt");
    let dir = xdg.path().join("nvlinkd");
    std::fs::create_dir(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::os::unix::fs::chown(&dir, Some(65534), Some(65534)).unwrap();
    let out = TempDir::new("sec-rt-out");
    let link = inv(LINK, corpus::dir(), &out);
    let expected = run(&real_nvlink(), &link, &[]);
    assert_eq!(expected.code, 0);
    let env = vec![
        ("XDG_RUNTIME_DIR".to_owned(), xdg.path().display().to_string()),
        ("CUDA_HOME".to_owned(), cuda_home().display().to_string()),
        ("NVLINKD_CACHE_DIR".to_owned(), xdg.path().join("cache").display().to_string()),
    ];
    for _ in 0..2 {
        let actual = run(&shim(), &link, &env);
        assert_eq!((actual.code, &actual.stdout, &actual.files), (expected.code, &expected.stdout, &expected.files));
        let said = String::from_utf8_lossy(&actual.stderr).into_owned();
        let (warned, rest): (Vec<&str>, Vec<&str>) =
            said.split_inclusive('\n').partition(|l| l.starts_with("nvlinkd: warning: "));
        assert_eq!(rest.concat().into_bytes(), expected.stderr, "nvlink's stderr: {said}");
        assert_eq!(warned.len(), 1, "{said}");
        assert!(warned[0].contains(&format!("{} is not this user's own directory", dir.display())), "{said}");
        assert!(warned[0].contains("fix: "), "{said}");
    }
    let left: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
    assert!(left.is_empty(), "the shim put something into another user's directory");
    assert!(!xdg.path().join("cache").exists(), "a daemon was started");
}

/// Remote tenants never share a flight: a link of one token that stalls (its
/// caller answering slowly; here held as it stores its entry,
/// `NVLINKD_TEST_HOLD_STORE`) does not hold another token's identical link,
/// which is answered meanwhile with nvlink's bytes. (In an adversarial run a
/// second tenant waited 37 s on the first one's stalled flight.)
#[test]
fn a_remote_link_never_waits_on_another_tenants_flight() {
    let hold_dir = TempDir::new("sec-tenant-hold");
    let hold = hold_dir.path().join("hold");
    std::fs::write(&hold, b"").unwrap();
    let pki = Pki::new();
    let (d, port) =
        nvlinkd_tests::remote::tls_daemon_env(&pki, &[], &[("NVLINKD_TEST_HOLD_STORE", hold.to_str().unwrap())]);
    let addr = format!("https://127.0.0.1:{port}");
    let out = TempDir::new("sec-tenant-out");
    let link = inv(LINK, corpus::dir(), &out);
    let expected = run(&real_nvlink(), &link, &[]);
    let (first, env) = (link.clone(), pki.shim_env(&addr, "never"));
    let leader = std::thread::spawn(move || run(&shim(), &first, &env));
    held_storing(&d, &hold, "the first tenant's link");
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    let (second, env) = (link.clone(), other_token_env(&pki, &addr, "never"));
    std::thread::spawn(move || done_tx.send(run(&shim(), &second, &env)));
    let other = done_rx.recv_timeout(Duration::from_secs(60));
    std::fs::remove_file(&hold).unwrap();
    let other = other.expect("the second tenant's link waited on the first tenant's flight");
    assert_same(&expected, &other, "the second tenant's link");
    assert_same(&expected, &leader.join().unwrap(), "the first tenant's link");
    assert_eq!(d.stat("fallbacks"), 0, "{}", d.stats());
}

/// A token holder that announces a file (a real input's digest and size) and
/// never sends it holds no other tenant's link: blob uploads are waited on
/// per caller, so the other token's link needing the same bytes asks its own
/// shim and is answered promptly, with nvlink's bytes. (In an adversarial run
/// it waited the reply timeout, 58.7 s.)
#[test]
fn a_blob_another_tenant_announced_and_never_sent_holds_no_link() {
    use nvlinkd_proto::v1::AnnouncedFile;
    let pki = Pki::new();
    let (d, port) = tls_daemon(&pki, &["--reply-timeout", "30s"]);
    let addr = format!("https://127.0.0.1:{port}");
    let inputs = TempDir::new("sec-blob-tenant-in");
    for f in ["accumulate.o", "scale.o"] {
        std::fs::copy(corpus::dir().join(f), inputs.path().join(f)).unwrap();
    }
    let out = TempDir::new("sec-blob-tenant-out");
    let link = inv(LINK, inputs.path(), &out);
    let expected = run(&real_nvlink(), &link, &[]);
    let rt = runtime();
    // The first tenant: its link announces both inputs by their true digests
    // and sizes, and never answers the daemon's requests for them.
    let held = rt.block_on(async {
        let files = ["accumulate.o", "scale.o"]
            .iter()
            .map(|f| {
                let data = std::fs::read(inputs.path().join(f)).unwrap();
                AnnouncedFile {
                    path: format!("/silent/{f}"),
                    exists: true,
                    is_dir: false,
                    size: data.len() as u64,
                    blake3: blake3::hash(&data).as_bytes().to_vec(),
                }
            })
            .collect();
        let args = ["--arch=sm_90", "accumulate.o", "scale.o", "-o", "out.cubin"].map(String::from).to_vec();
        let start = Start { args, cwd: "/silent".into(), files, ..Default::default() };
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        tx.send(ClientMessage { msg: Some(client_message::Msg::Start(start)) }).await.unwrap();
        let mut client = NvlinkdClient::new(tls_channel(&pki, port).await);
        tokio::spawn(async move {
            let request = with_token(tokio_stream::wrappers::ReceiverStream::new(rx), TOKEN);
            if let Ok(r) = client.link(request).await {
                let mut answers = r.into_inner();
                while let Ok(Some(_)) = answers.message().await {}
            }
        });
        tx
    });
    // Admitted (its slot taken), it then waits for its own upload.
    d.wait_stat("remote_links", 1);
    std::thread::sleep(Duration::from_millis(300));
    let t0 = Instant::now();
    let other = run(&shim(), &link, &other_token_env(&pki, &addr, "never"));
    let took = t0.elapsed();
    assert_same(&expected, &other, "the other tenant's link");
    assert!(took < Duration::from_secs(15), "the other tenant's link waited {took:?} on the first one's upload");
    drop(held);
    rt.shutdown_background();
}

/// A thin archive's members are files nvlink reads beside it, which the
/// daemon neither keys nor mirrors: its links are the caller's nvlink's,
/// never cached, so a changed member is seen (a cubin linked from the old
/// member was served after it changed), and a remote caller gets nvlink's
/// answer (its members were missing from the daemon's sandbox).
#[test]
fn a_thin_archives_members_are_read_by_the_callers_nvlink() {
    let dir = TempDir::new("sec-thin");
    for f in ["mathlib_main.o", "mathlib_1.o", "mathlib_2.o"] {
        std::fs::copy(corpus::dir().join(f), dir.path().join(f)).unwrap();
    }
    let ar =
        Command::new("ar").args(["rcT", "libthin.a", "mathlib_1.o", "mathlib_2.o"]).current_dir(dir.path()).status();
    assert!(ar.unwrap().success());
    let pki = Pki::new();
    let (d, port) = secure_daemon(&pki);
    let addr = format!("https://127.0.0.1:{port}");
    let out = TempDir::new("sec-thin-out");
    let link = inv("--arch=sm_90 mathlib_main.o libthin.a -o {OUT}/out.cubin", dir.path(), &out);
    for change in [false, true] {
        if change {
            // A member that no longer defines what mathlib_main.o calls.
            std::fs::copy(corpus::dir().join("accumulate.o"), dir.path().join("mathlib_2.o")).unwrap();
        }
        let expected = run(&real_nvlink(), &link, &[]);
        assert_eq!(expected.code != 0, change, "{}", String::from_utf8_lossy(&expected.stderr));
        let mut env = d.shim_env();
        env.push(("NVLINKD_FALLBACK".into(), "auto".into()));
        assert_same(&expected, &run(&shim(), &link, &env), &format!("a local link, member changed: {change}"));
        assert_same(&expected, &run(&shim(), &link, &pki.shim_env(&addr, "auto")), "a remote link");
    }
    assert_eq!(d.stat("cache_hits"), 0, "a thin archive's link was served from the cache: {}", d.stats());
}

/// Under LTO nvlink loads the libNVVM under `-nvvmpath`: whether there is
/// one, and which, is part of the key. Locally, a link routed for an
/// `-nvvmpath` of its own sees the library go (nvlink: `elfLink linker library
/// load error`) instead of being served the cubin linked while it was there.
/// Remotely, a caller whose `-nvvmpath` (relative, the same argument) has no
/// libNVVM gets nvlink's error, and another caller with the same command
/// line and inputs whose directory has one still links (it was served the
/// first one's error from the cache).
#[test]
fn the_libnvvm_under_nvvmpath_is_part_of_the_key() {
    let pki = Pki::new();
    let (d, port) = secure_daemon(&pki);
    let addr = format!("https://127.0.0.1:{port}");
    let nvvm_of = |dir: &Path| {
        std::fs::create_dir_all(dir.join("lib64")).unwrap();
        std::fs::copy(cuda_home().join("nvvm/lib64/libnvvm.so"), dir.join("lib64/libnvvm.so")).unwrap();
        let libdevice = dir.join("libdevice");
        std::fs::create_dir_all(&libdevice).unwrap();
        std::fs::copy(cuda_home().join("nvvm/libdevice/libdevice.10.bc"), libdevice.join("libdevice.10.bc")).unwrap();
    };
    let twins: Vec<TempDir> = (0..2).map(|i| TempDir::new(&format!("sec-nvvm-{i}"))).collect();
    for t in &twins {
        for f in ["accumulate_lto.o", "scale_lto.o"] {
            std::fs::copy(corpus::dir().join(f), t.path().join(f)).unwrap();
        }
        std::fs::create_dir_all(t.path().join("nv")).unwrap();
    }
    let args = format!(
        "--arch=sm_90 -dlto -nvvmpath=nv -L{} accumulate_lto.o scale_lto.o -lcudadevrt -o {{OUT}}/out.cubin",
        cuda_home().join("lib").display()
    );
    let out = TempDir::new("sec-nvvm-out");
    // Locally: with the library, then without.
    let local = inv(&args, twins[0].path(), &out);
    nvvm_of(&twins[0].path().join("nv"));
    for present in [true, false] {
        if !present {
            std::fs::remove_file(twins[0].path().join("nv/lib64/libnvvm.so")).unwrap();
        }
        let expected = run(&real_nvlink(), &local, &[]);
        assert_eq!(expected.code == 0, present, "{}", String::from_utf8_lossy(&expected.stderr));
        assert_same(
            &expected,
            &run(&shim(), &local, &d.shim_env()),
            &format!("a local link, libNVVM there: {present}"),
        );
    }
    // Remotely: the first caller's directory has none, the second's has one.
    nvvm_of(&twins[1].path().join("nv"));
    for t in &twins {
        let link = inv(&args, t.path(), &out);
        let expected = run(&real_nvlink(), &link, &[]);
        assert_same(&expected, &run(&shim(), &link, &pki.shim_env(&addr, "never")), "a remote link");
    }
}

/// A remote caller that answers one file request slowly holds no plan
/// permit meanwhile: what its link may ask is asked before the link takes
/// one. On a daemon with one plan permit per class, a remote link stalls one
/// reply 20 s, and a local link meanwhile is answered promptly with nvlink's
/// bytes. The stalled questions: an input of a `-time` link (never cached,
/// it read its inputs under the permit: a token holder held every
/// cache-miss link 35 s), the `-time` file of a routed link, and the libNVVM
/// stat of a routed link naming `-nvvmpath` (both asked while mirroring).
#[test]
fn a_slow_remote_reply_holds_no_plan_permit() {
    use nvlinkd_proto::v1::FileRequest;
    let work = TempDir::new("sec-slow-reply");
    std::fs::write(work.path().join("t.csv"), b"").unwrap();
    std::fs::create_dir_all(work.path().join("nv/lib64")).unwrap();
    for f in ["accumulate.o", "scale.o"] {
        std::fs::copy(corpus::dir().join(f), work.path().join(f)).unwrap();
    }
    type Stall = fn(&FileRequest) -> bool;
    let cases: [(&[&str], Stall); 3] = [
        (&["--arch=sm_90", "accumulate.o", "scale.o", "-time", "t.csv", "-o", "out.cubin"], |r| {
            r.path.ends_with("/scale.o") && r.op() == nvlinkd_proto::v1::file_request::Op::Read
        }),
        (&["--arch=sm_90", "--preserve-relocs", "accumulate.o", "scale.o", "-time", "t.csv", "-o", "out.cubin"], |r| {
            r.path.ends_with("/t.csv") && r.op() == nvlinkd_proto::v1::file_request::Op::Read
        }),
        (&["--arch=sm_90", "--preserve-relocs", "-nvvmpath=nv", "accumulate.o", "scale.o", "-o", "out.cubin"], |r| {
            r.path.ends_with("libnvvm.so")
        }),
    ];
    for (args, stall) in cases {
        slow_reply_beside_a_local_link(work.path(), args, stall);
    }
}

fn slow_reply_beside_a_local_link(cwd: &Path, args: &[&str], stall: fn(&nvlinkd_proto::v1::FileRequest) -> bool) {
    use nvlinkd_proto::v1::{server_message, ServerMessage};
    let pki = Pki::new();
    let (d, port) = tls_daemon(&pki, &["--jobs", "1", "--reply-timeout", "60s"]);
    let rt = runtime();
    let stalled = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let seen = stalled.clone();
    let start = Start {
        args: args.iter().map(|a| a.to_string()).collect(),
        cwd: cwd.display().to_string(),
        answers_nvvm_stat: true,
        ..Default::default()
    };
    let slow = rt.spawn(async move {
        let (tx, rx) = tokio::sync::mpsc::channel::<ClientMessage>(64);
        tx.send(ClientMessage { msg: Some(client_message::Msg::Start(start)) }).await.unwrap();
        let mut client = NvlinkdClient::new(tls_channel(&pki, port).await);
        let request = with_token(tokio_stream::wrappers::ReceiverStream::new(rx), TOKEN);
        let mut inbound = client.link(request).await.unwrap().into_inner();
        while let Ok(Some(ServerMessage { msg: Some(m) })) = inbound.message().await {
            let server_message::Msg::File(req) = m else { continue };
            if stall(&req) && !seen.swap(true, std::sync::atomic::Ordering::SeqCst) {
                tokio::time::sleep(Duration::from_secs(20)).await;
            }
            let reply = answer_from_disk(&req, Path::new(&req.path));
            if tx.send(ClientMessage { msg: Some(client_message::Msg::File(reply)) }).await.is_err() {
                break;
            }
        }
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    while !stalled.load(std::sync::atomic::Ordering::SeqCst) {
        assert!(Instant::now() < deadline, "{args:?}: the slow link never asked what it stalls: {}", d.stats());
        std::thread::sleep(Duration::from_millis(10));
    }
    // Its questions asked, it takes its permit; then the local link.
    std::thread::sleep(Duration::from_millis(300));
    let out = TempDir::new("sec-slow-reply-out");
    let link = inv(LINK, corpus::dir(), &out);
    let expected = run(&real_nvlink(), &link, &[]);
    let t0 = Instant::now();
    let local = run(&shim(), &link, &d.shim_env());
    let took = t0.elapsed();
    assert_same(&expected, &local, "a local link beside a stalled remote one");
    assert!(took < Duration::from_secs(10), "{args:?}: the local link waited {took:?} on the stalled remote link");
    slow.abort();
    rt.shutdown_background();
}

/// A well-behaved shim's reply to the daemon's file request: the stat or the
/// bytes of `path` on this machine, or why not.
fn answer_from_disk(req: &nvlinkd_proto::v1::FileRequest, path: &Path) -> nvlinkd_proto::v1::FileReply {
    use nvlinkd_proto::v1::{file_reply, file_request, FileError, FileReply, FileStat};
    let error = |e: std::io::Error| file_reply::Result::Error(FileError { kind: 0, message: e.to_string() });
    let result = match req.op() {
        file_request::Op::Stat => std::fs::metadata(path)
            .map(|m| file_reply::Result::Stat(FileStat { is_dir: m.is_dir(), size: m.len() }))
            .unwrap_or_else(error),
        file_request::Op::Read => std::fs::read(path).map(|d| file_reply::Result::Data(d.into())).unwrap_or_else(error),
    };
    FileReply { id: req.id, result: Some(result), more: false }
}

/// Wait until a link is held storing its entry (`NVLINKD_TEST_HOLD_STORE`
/// at `hold` marks `hold.storing`).
fn held_storing(d: &Daemon, hold: &Path, which: &str) {
    let storing = hold.with_file_name("hold.storing");
    let deadline = Instant::now() + Duration::from_secs(120);
    while !storing.exists() {
        assert!(Instant::now() < deadline, "{which} never stored: {}", d.stats());
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// `nvlinkd <command> --socket S` with `env`: (success, stdout, stderr); a
/// command still running after 20 s is ended (`timeout`).
fn nvlinkd_command(what: &str, socket: &Path, env: &[(&str, &str)]) -> (bool, String, String) {
    let o = Command::new("timeout")
        .arg("20")
        .arg(nvlinkd())
        .arg(what)
        .args(["--socket".as_ref(), socket.as_os_str()])
        .args(if what == "start" { vec!["--cuda-home".to_string(), cuda_home().display().to_string()] } else { vec![] })
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    (
        o.status.success(),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// The control commands talk only to a daemon of this user's or root's, as
/// the shim does (`SO_PEERCRED`, before anything is sent): another user's
/// process behind the socket (in a directory it made first, where the
/// victim's default socket would be) is refused with the reason, so it can
/// neither say that a daemon is running (`start` starts none), nor print
/// its words, nor have `watch` write files.
#[test]
fn a_control_command_refuses_a_daemon_of_another_user() {
    let pki = Pki::new();
    let Some(theirs) = NobodyDaemon::start(&pki) else { return };
    let socket = theirs.socket();
    let refused = |what: &str, (ok, stdout, stderr): (bool, String, String)| {
        assert!(!ok, "{what} took another user's daemon: {stdout}{stderr}");
        assert!(stderr.contains("refusing the daemon at") && stderr.contains("uid 65534"), "{what}: {stderr}");
        assert!(!stdout.contains("running"), "{what}: {stdout}");
    };
    for what in ["status", "start", "stats", "stop", "events"] {
        refused(what, nvlinkd_command(what, &socket, &[]));
    }
    let out = TempDir::new("sec-watch-out");
    let o = Command::new("timeout")
        .arg("20")
        .arg(nvlinkd())
        .args(["watch", "--socket"])
        .arg(&socket)
        .arg("--")
        .args(["--arch=sm_90", "accumulate.o", "scale.o", "-o"])
        .arg(out.path().join("out.cubin"))
        .current_dir(corpus::dir())
        .output()
        .unwrap();
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    refused("watch", (o.status.success(), text(&o.stdout), text(&o.stderr)));
    // `stop` stopped nothing: their daemon still answers.
    assert!(std::os::unix::net::UnixStream::connect(&socket).is_ok());
}

/// The default socket only in a runtime directory of this user's own: one
/// another user made first (or a symlink, or one others can write) is
/// refused by the control commands and by `serve`, naming the fix; nothing
/// is bound or changed there.
#[test]
fn the_default_runtime_directory_must_be_this_users_own() {
    use std::os::unix::fs::PermissionsExt;
    let base = TempDir::new("sec-rt");
    let runtime = base.path().join("nvlinkd");
    let socket = runtime.join("nvlinkd.sock");
    let xdg = base.path().display().to_string();
    let env = [("XDG_RUNTIME_DIR", xdg.as_str()), ("NVLINKD_SOCKET", "")];
    let elsewhere = base.path().join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    std::fs::set_permissions(&elsewhere, std::fs::Permissions::from_mode(0o700)).unwrap();
    // A symlink to a private directory of this user's: another user's link
    // could be re-pointed between the checks and the bind.
    std::os::unix::fs::symlink(&elsewhere, &runtime).unwrap();
    let serve = |env: &[(&str, &str)]| {
        Command::new("timeout")
            .arg("20")
            .arg(nvlinkd())
            .args(["serve", "--cuda-home"])
            .arg(cuda_home())
            .arg("--cache-dir")
            .arg(base.path().join("cache"))
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .output()
            .unwrap()
    };
    let o = serve(&env);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && o.status.code() != Some(124), "served through a symlink: {o:?}");
    assert!(stderr.contains("is a symlink"), "{stderr}");
    assert!(!elsewhere.join("nvlinkd.sock").exists(), "a socket was bound through the symlink");
    let (ok, _, stderr) = nvlinkd_command("status", &socket, &env);
    assert!(!ok && stderr.contains("refusing the daemon at") && stderr.contains("is a symlink"), "{stderr}");
    // Another user's directory, open to all as it may be.
    std::fs::remove_file(&runtime).unwrap();
    std::fs::create_dir(&runtime).unwrap();
    std::fs::set_permissions(&runtime, std::fs::Permissions::from_mode(0o755)).unwrap();
    if std::os::unix::fs::chown(&runtime, Some(65534), None).is_ok() {
        for what in ["status", "stop", "start"] {
            let (ok, _, stderr) = nvlinkd_command(what, &socket, &env);
            assert!(!ok, "{what}: {stderr}");
            assert!(
                stderr.contains("refusing the daemon at") && stderr.contains("belongs to uid 65534"),
                "{what}: {stderr}"
            );
        }
    }
}

/// Refused calls are logged at most once per interval, with the count held
/// back: a token holder asking for administration over TCP thousands of
/// times (or another user calling on an opened local socket) cannot fill
/// the log.
#[test]
fn refused_calls_are_logged_at_most_once_per_interval() {
    let pki = Pki::new();
    let (d, port) = secure_daemon(&pki);
    runtime().block_on(async {
        let mut client = NvlinkdClient::new(tls_channel(&pki, port).await);
        for _ in 0..300 {
            let e = client.shutdown(with_token(ShutdownRequest {}, TOKEN)).await.unwrap_err();
            assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
        }
    });
    d.wait_log("administration over the remote listener refused", 1);
    std::thread::sleep(Duration::from_millis(500));
    let lines = d.log().lines().filter(|l| l.contains("administration over the remote listener refused")).count();
    assert!(lines <= 2, "{lines} lines for 300 refusals:\n{}", d.log());
    assert!(d.answers(), "the daemon died");
    // Another user on the opened unix socket.
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return;
    }
    use std::os::unix::fs::PermissionsExt;
    let sock = d.socket();
    std::fs::set_permissions(sock.parent().unwrap(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o777)).unwrap();
    let as_nobody = |script: &str| {
        Command::new("timeout")
            .args(["60", "setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "--", "sh", "-c", script])
            .current_dir("/")
            .output()
    };
    let nvlinkd = nvlinkd().display().to_string();
    match as_nobody(&format!("'{nvlinkd}' --version")) {
        Ok(o) if o.status.success() => {}
        other => {
            eprintln!("skipped the local part: nobody cannot run nvlinkd here ({other:?})");
            return;
        }
    }
    let script =
        format!("for i in $(seq 40); do '{nvlinkd}' stats --socket '{}' 2>/dev/null; done; true", sock.display());
    as_nobody(&script).unwrap();
    assert!(d.stat("auth_failures") >= 40, "{}", d.stats());
    std::thread::sleep(Duration::from_millis(500));
    let lines = d.log().lines().filter(|l| l.contains("a caller of another user on the local socket refused")).count();
    assert!((1..=2).contains(&lines), "{lines} lines for 40 refusals:\n{}", d.log());
}
