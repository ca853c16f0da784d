//! Signals an operator sends (issue "a farm an operator can run"): SIGHUP
//! reloads the listener's certificate, key and tokens without a restart, keeps
//! the old ones when a new file is bad, reopens the log (logrotate), and never
//! stops the daemon. Links are compared with the real nvlink.

use std::path::Path;
use std::time::Duration;

use nvlinkd_proto::v1::{nvlinkd_client::NvlinkdClient, StatsRequest};
use nvlinkd_tests::compare;
use nvlinkd_tests::corpus;
use nvlinkd_tests::daemon::Daemon;
use nvlinkd_tests::env::{real_nvlink, shim, TempDir};
use nvlinkd_tests::remote::{tls_daemon, Pki, TOKEN};
use nvlinkd_tests::run::{run, Invocation, Run};
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint};

const LINK: &str = "--arch=sm_90 accumulate.o scale.o -o {OUT}/out.cubin";

fn inv(out: &TempDir) -> Invocation {
    Invocation::templated(LINK, corpus::dir(), out)
}

/// A daemon serving `--listen` with TLS and the Pki's token file.
fn secure_daemon(pki: &Pki) -> (Daemon, u16) {
    tls_daemon(pki, &[])
}

/// The shim's environment for `addr`, presenting the token in file `token`
/// of the Pki's directory, never falling back.
fn shim_env(pki: &Pki, addr: &str, token: &str) -> Vec<(String, String)> {
    let mut env = pki.shim_env(addr, "never");
    for (k, v) in &mut env {
        if k == nvlinkd_proto::paths::ENV_TOKEN_FILE {
            *v = pki.file(token);
        }
    }
    env
}

fn assert_like_nvlink(expected: &Run, actual: &Run, what: &str) {
    let cmp = compare::runs(expected, actual);
    assert!(cmp.problems.is_empty() && cmp.identical, "{what}: {:?}", cmp.problems);
}

fn refused(r: &Run, what: &str) {
    assert_ne!(r.code, 0, "{what}: the link succeeded");
    assert!(r.files.is_empty(), "{what}: output written without a daemon's answer");
}

/// `Stats` over a new TLS connection (so with the certificate in force now),
/// presenting `token`: whether the daemon answered.
fn stats_over_a_new_connection(pki: &Pki, host: &str, port: u16, token: &str) -> Result<(), String> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let ca = Certificate::from_pem(std::fs::read(pki.file("ca.pem")).unwrap());
        let channel = Endpoint::from_shared(format!("https://{host}:{port}"))
            .unwrap()
            .tls_config(ClientTlsConfig::new().ca_certificate(ca))
            .unwrap()
            .connect()
            .await
            .map_err(|e| format!("connect: {e:?}"))?;
        let mut request = tonic::Request::new(StatsRequest {});
        request.metadata_mut().insert("authorization", format!("Bearer {token}").parse().unwrap());
        NvlinkdClient::new(channel).stats(request).await.map(|_| ()).map_err(|s| format!("{s:?}"))
    })
}

#[test]
fn sighup_rotates_the_certificate_and_the_tokens() {
    // The first certificate names 127.0.0.1 only, the next one localhost only:
    // which name a shim can reach says which certificate is in force.
    let pki = Pki::for_hosts(&["127.0.0.1"]);
    let (mut d, port) = secure_daemon(&pki);
    let out = TempDir::new("rl-out");
    let expected = run(&real_nvlink(), &inv(&out), &[]);
    assert_eq!(expected.code, 0);
    let by_ip = format!("https://127.0.0.1:{port}");
    let by_name = format!("https://localhost:{port}");
    assert_like_nvlink(&expected, &run(&shim(), &inv(&out), &shim_env(&pki, &by_ip, "client-token")), "before");
    refused(&run(&shim(), &inv(&out), &shim_env(&pki, &by_name, "client-token")), "a name the certificate lacks");

    // The rotation: a new certificate and key, new tokens. On disk only, the
    // daemon goes on with the old ones until told.
    pki.issue(&["localhost"], "cert.pem", "key.pem");
    pki.replace("tokens", b"# rotated\nrotated:new-token-of-the-rotation\n");
    pki.replace("new-token", b"new-token-of-the-rotation\n");
    let failures = d.stat("auth_failures");
    refused(&run(&shim(), &inv(&out), &shim_env(&pki, &by_ip, "new-token")), "new token before SIGHUP");
    assert_eq!(d.stat("auth_failures"), failures + 1);

    d.signal(libc::SIGHUP);
    let reloaded = d.wait_log("SIGHUP: token file reloaded", 1);
    assert!(reloaded[0].contains("tokens=1 names=rotated"), "{reloaded:?}");
    assert!(!reloaded[0].contains("new-token"), "a secret in the log: {reloaded:?}");
    d.wait_log("SIGHUP: TLS certificate and key reloaded", 1);
    assert!(d.running(), "SIGHUP stopped the daemon");
    let requests = d.stat("requests");
    assert_like_nvlink(&expected, &run(&shim(), &inv(&out), &shim_env(&pki, &by_name, "new-token")), "after");
    assert_eq!(d.stat("requests"), requests + 1, "the rotated daemon did not serve the link");
    let failures = d.stat("auth_failures");
    refused(&run(&shim(), &inv(&out), &shim_env(&pki, &by_name, "client-token")), "the old token after SIGHUP");
    assert_eq!(d.stat("auth_failures"), failures + 1, "the old token was not refused by the daemon");
    refused(&run(&shim(), &inv(&out), &shim_env(&pki, &by_ip, "new-token")), "the old certificate's name");
    assert!(!d.log().contains("not reloaded"), "{}", d.log());
    // The rotated token's links count under its name; the old token (a bare
    // secret on line 4 of the first file) keeps what it counted.
    let tokens = &d.stats()["tokens"];
    assert_eq!(
        (tokens["rotated"]["links"].as_u64(), tokens["token-4"]["links"].as_u64()),
        (Some(1), Some(1)),
        "{tokens}"
    );
}

/// A bad state of the listener's files.
struct BadFile<'a> {
    what: &'static str,
    /// Puts it on disk.
    make: Box<dyn Fn() + 'a>,
    /// The warning that says which part was kept.
    kept: &'static str,
    /// A word of the reason given.
    why: &'static str,
}

#[test]
fn sighup_with_a_bad_file_keeps_the_old_ones_and_says_why() {
    let pki = Pki::new();
    let (mut d, port) = secure_daemon(&pki);
    let good = |f: &str| std::fs::read(pki.file(f)).unwrap();
    let (cert, key, tokens) = (good("cert.pem"), good("key.pem"), good("tokens"));
    let other_key = rcgen::KeyPair::generate().unwrap().serialize_pem();
    // Each: the bad state on disk, which part is kept, and a word of the reason logged.
    let cases: Vec<BadFile> = vec![
        BadFile {
            what: "a token file without tokens",
            make: Box::new(|| pki.replace("tokens", b"# all revoked\n\n")),
            kept: "token file not reloaded",
            why: "holds no token",
        },
        BadFile {
            what: "a token file other users can read",
            make: Box::new(|| {
                use std::os::unix::fs::PermissionsExt;
                std::fs::set_permissions(pki.file("tokens"), std::fs::Permissions::from_mode(0o644)).unwrap()
            }),
            kept: "token file not reloaded",
            why: "chmod 600",
        },
        BadFile {
            what: "a missing token file",
            make: Box::new(|| std::fs::remove_file(pki.file("tokens")).unwrap()),
            kept: "token file not reloaded",
            why: "cannot read --token-file",
        },
        BadFile {
            what: "a key that does not match the certificate",
            make: Box::new(|| pki.replace("key.pem", other_key.as_bytes())),
            kept: "TLS files not reloaded",
            why: "--tls-key",
        },
        BadFile {
            what: "a key other users can read",
            make: Box::new(|| {
                use std::os::unix::fs::PermissionsExt;
                std::fs::set_permissions(pki.file("key.pem"), std::fs::Permissions::from_mode(0o644)).unwrap()
            }),
            kept: "TLS files not reloaded",
            why: "chmod 600",
        },
        BadFile {
            what: "a certificate that is not PEM",
            make: Box::new(|| pki.replace("cert.pem", b"-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydA==\n")),
            kept: "TLS files not reloaded",
            why: "--tls-cert",
        },
        BadFile {
            what: "an unreadable key",
            make: Box::new(|| std::fs::remove_file(pki.file("key.pem")).unwrap()),
            kept: "TLS files not reloaded",
            why: "cannot read --tls-key",
        },
    ];
    for (n, BadFile { what, make, kept, why }) in cases.iter().enumerate() {
        make();
        d.signal(libc::SIGHUP);
        let warnings = d.wait_log(kept, 1);
        assert!(warnings.iter().any(|l| l.contains(why) && l.contains("WARN")), "{what}: {warnings:?}");
        assert!(d.running(), "{what}: SIGHUP stopped the daemon");
        // The old certificate and token still serve new connections.
        stats_over_a_new_connection(&pki, "127.0.0.1", port, TOKEN).unwrap_or_else(|e| panic!("{what}: {e}"));
        // Put the good files back, and clear the log for the next case.
        for (f, bytes) in [("cert.pem", &cert), ("key.pem", &key), ("tokens", &tokens)] {
            pki.replace(f, bytes);
        }
        std::fs::write(d.cache_dir().join("nvlinkd.log"), "").unwrap();
        eprintln!("case {n} ({what}): kept");
    }
    let out = TempDir::new("rl-bad-out");
    let expected = run(&real_nvlink(), &inv(&out), &[]);
    let addr = format!("https://127.0.0.1:{port}");
    assert_like_nvlink(&expected, &run(&shim(), &inv(&out), &shim_env(&pki, &addr, "client-token")), "after");
}

/// A token file rewritten in place (not replaced by a rename) while SIGHUP
/// reads it: the daemon reads a prefix, its last token cut short. The reload
/// is refused with one warning naming the file and line, and the old tokens
/// stay in force.
#[test]
fn sighup_reading_a_token_file_cut_short_keeps_the_old_tokens() {
    let pki = Pki::new();
    let (mut d, port) = secure_daemon(&pki);
    let tokens = std::fs::read_to_string(pki.file("tokens")).unwrap();
    let cut = &tokens[..tokens.trim_end().len() - 8];
    assert!(!cut.ends_with('\n') && cut.ends_with(&TOKEN[..TOKEN.len() - 8]), "{cut:?}");
    // In place: the same file, truncated and written (as `>` in a shell does).
    std::fs::write(pki.file("tokens"), cut).unwrap();
    d.signal(libc::SIGHUP);
    let warnings = d.wait_log("SIGHUP: token file", 1);
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    let w = &warnings[0];
    assert!(w.contains("not reloaded") && w.contains("WARN"), "{w}");
    assert!(w.contains(&pki.file("tokens")) && w.contains("line 4") && w.contains("16 bytes"), "{w}");
    assert!(!w.contains(cut.lines().last().unwrap()), "a secret in the log: {w}");
    assert!(d.running(), "SIGHUP stopped the daemon");
    // The old token still serves new connections.
    stats_over_a_new_connection(&pki, "127.0.0.1", port, TOKEN).unwrap();
}

#[test]
fn sighup_never_stops_the_daemon_and_reopens_its_log() {
    let mut d = Daemon::start();
    let log = d.cache_dir().join("nvlinkd.log");
    d.wait_log("nvlinkd serving", 1);
    // logrotate: the log moved away, then SIGHUP.
    let rotated = d.cache_dir().join("nvlinkd.log.1");
    std::fs::rename(&log, &rotated).unwrap();
    for n in 1..=3 {
        d.signal(libc::SIGHUP);
        d.wait_log("SIGHUP: log file reopened", n);
    }
    std::thread::sleep(Duration::from_millis(200));
    assert!(d.running(), "SIGHUP stopped the daemon");
    assert!(d.answers(), "the daemon does not answer on its socket after SIGHUP");
    assert!(Path::new(&d.socket()).exists(), "socket gone");
    let out = TempDir::new("rl-hup-out");
    let expected = run(&real_nvlink(), &inv(&out), &[]);
    assert_like_nvlink(&expected, &run(&shim(), &inv(&out), &d.shim_env()), "after SIGHUP");
    // The new file has the lines after the first SIGHUP, the old one those before.
    d.wait_log("link done", 1);
    let old = std::fs::read_to_string(&rotated).unwrap();
    assert!(old.contains("nvlinkd serving") && !old.contains("link done"), "{old}");
}
