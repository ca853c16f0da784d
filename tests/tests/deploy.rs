//! The deployment files in `deploy/` checked by real validators, installed from
//! their registries by `scripts/setup-validators.sh` (cached in `.tools/`):
//! hadolint for the Dockerfiles, kubernetes-validate (the API's schemas,
//! strict) for the Kubernetes manifests, `systemd-analyze verify` for the
//! systemd units, check-jsonschema (its bundled GitHub workflow and GitLab CI
//! schemas) for the CI examples, Python's parser for the Bazel example
//! (Starlark's syntax is Python's; Bazel itself cannot be installed here).
//! Each test also hands its validator a copy broken in one place and expects
//! it refused, so a validator that stopped checking (or a check that stopped
//! reaching it) fails the test instead of passing it. Where a validator cannot
//! be installed (offline, no root for apt-get) the test says so and skips.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

use nvlinkd_tests::env::{repo_root, TempDir};

/// The directory of `hadolint`, `kubernetes-validate` and `check-jsonschema`,
/// installed once per test process; `None` (after saying why) when they cannot be.
fn validators() -> Option<&'static Path> {
    static DIR: OnceLock<Option<PathBuf>> = OnceLock::new();
    DIR.get_or_init(|| {
        let out = Command::new(repo_root().join("scripts/setup-validators.sh")).output().ok()?;
        if !out.status.success() {
            println!("SKIP: cannot install the deploy/ validators: {}", String::from_utf8_lossy(&out.stderr));
            return None;
        }
        Some(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
    })
    .as_deref()
}

fn deploy(path: &str) -> PathBuf {
    repo_root().join("deploy").join(path)
}

fn text(out: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

/// A copy of `file` in `dir` with `edit` applied (which must change it).
/// checkov's policies (offline: `--skip-download`) pass on deploy/'s
/// Kubernetes manifests and Dockerfiles, with the skips each file names and
/// explains; a Deployment that lets its container escalate privileges, or
/// a Dockerfile without a HEALTHCHECK, fails.
#[test]
fn the_deploy_files_pass_checkov() {
    let Some(bin) = validators() else { return };
    let checkov = |dir: &Path| {
        Command::new(bin.join("checkov"))
            .args(["--quiet", "--compact", "--skip-download", "--framework", "kubernetes", "dockerfile", "-d"])
            .arg(dir)
            .output()
            .unwrap()
    };
    let out = checkov(&deploy(""));
    let report = text(&out);
    assert!(out.status.success(), "checkov on deploy/:\n{report}");
    assert!(report.contains("kubernetes scan results") && report.contains("dockerfile scan results"), "{report}");
    let dir = TempDir::new("deploy-checkov");
    broken(dir.path(), &deploy("kubernetes/deployment.yaml"), |s| {
        s.replace("allowPrivilegeEscalation: false", "allowPrivilegeEscalation: true")
    });
    let out = checkov(dir.path());
    assert!(
        !out.status.success() && text(&out).contains("CKV_K8S_20"),
        "an escalating container passed:\n{}",
        text(&out)
    );
    let dir = TempDir::new("deploy-checkov-docker");
    broken(dir.path(), &deploy("Dockerfile"), |s| {
        s.lines().filter(|l| !l.starts_with("HEALTHCHECK")).map(|l| format!("{l}\n")).collect()
    });
    let out = checkov(dir.path());
    assert!(
        !out.status.success() && text(&out).contains("CKV_DOCKER_2"),
        "a Dockerfile without HEALTHCHECK passed:\n{}",
        text(&out)
    );
}

fn broken(dir: &Path, file: &Path, edit: impl Fn(&str) -> String) -> PathBuf {
    let original = std::fs::read_to_string(file).unwrap();
    let changed = edit(&original);
    assert_ne!(changed, original, "the edit does not apply to {}", file.display());
    let copy = dir.join(file.file_name().unwrap());
    std::fs::write(&copy, changed).unwrap();
    copy
}

/// hadolint, with deploy/'s settings (warnings fail), on `file`.
fn hadolint(bin: &Path, file: &Path) -> Output {
    Command::new(bin.join("hadolint")).arg("--config").arg(deploy(".hadolint.yaml")).arg(file).output().unwrap()
}

#[test]
fn the_dockerfile_passes_hadolint() {
    let Some(bin) = validators() else { return };
    let out = hadolint(bin, &deploy("Dockerfile"));
    assert!(out.status.success() && out.stdout.is_empty(), "hadolint on deploy/Dockerfile:\n{}", text(&out));
    // A root image is refused (DL3002): the rules, warnings included, are applied.
    let dir = TempDir::new("deploy-docker");
    let root = broken(dir.path(), &deploy("Dockerfile"), |s| format!("{s}USER root\n"));
    let out = hadolint(bin, &root);
    assert!(!out.status.success() && text(&out).contains("DL3002"), "a root image passed:\n{}", text(&out));
}

/// The fragment that adds nvlinkd to an image of NVIDIA's CUDA packages
/// passes hadolint; the same fragment on an untagged base image is refused
/// (DL3006).
#[test]
fn the_cuda_image_fragment_passes_hadolint() {
    let Some(bin) = validators() else { return };
    let fragment = deploy("docker/Dockerfile.cuda-nvlinkd");
    let out = hadolint(bin, &fragment);
    assert!(out.status.success() && out.stdout.is_empty(), "hadolint on {}:\n{}", fragment.display(), text(&out));
    let dir = TempDir::new("deploy-cuda-image");
    let untagged = broken(dir.path(), &fragment, |s| s.replace("FROM ${CUDA_IMAGE}", "FROM nvidia/cuda"));
    let out = hadolint(bin, &untagged);
    assert!(!out.status.success() && text(&out).contains("DL3006"), "an untagged base image passed:\n{}", text(&out));
}

#[test]
fn the_kubernetes_manifests_validate() {
    let Some(bin) = validators() else { return };
    let validate =
        |files: &[PathBuf]| Command::new(bin.join("kubernetes-validate")).arg("--strict").args(files).output().unwrap();
    let mut manifests: Vec<PathBuf> = std::fs::read_dir(deploy("kubernetes"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    manifests.sort();
    let names: Vec<String> = manifests.iter().map(|p| p.file_name().unwrap().to_string_lossy().into_owned()).collect();
    assert_eq!(
        names,
        ["deployment.yaml", "namespace.yaml", "networkpolicy.yaml", "pdb.yaml", "secret.yaml", "service.yaml"]
    );
    let out = validate(&manifests);
    let report = text(&out);
    assert!(out.status.success(), "kubernetes-validate:\n{report}");
    for name in &names {
        assert!(report.contains(&format!("{name} passed")), "{name} not validated:\n{report}");
    }
    // An unknown field is refused (strict), and a port that is not a number.
    let dir = TempDir::new("deploy-k8s");
    for edit in [
        |s: &str| s.replace("  replicas: 3", "  replica: 3"),
        |s: &str| s.replace("containerPort: 7457", "containerPort: grpc"),
    ] {
        let bad = broken(dir.path(), &deploy("kubernetes/deployment.yaml"), edit);
        let out = validate(&[bad]);
        assert!(!out.status.success(), "a broken Deployment passed:\n{}", text(&out));
    }
}

/// `systemd-analyze verify` of `unit`, as a system unit under a private root
/// (`--root`: the targets the unit refers to copied from the system, its
/// `ExecStart` and `ExecReload` binaries stubs) or as a user unit (a private home and runtime
/// directory). Its output: empty for a unit without problems (it exits 0 on
/// unknown keys and only says so).
fn systemd_verify(unit: &Path, user: bool) -> Output {
    let dir = TempDir::new("deploy-systemd");
    let root = dir.path();
    let stub = |path: &Path| {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    };
    let name = unit.file_name().unwrap();
    if user {
        stub(&root.join("home/.local/bin/nvlinkd"));
        std::fs::create_dir_all(root.join("run")).unwrap();
        Command::new("systemd-analyze")
            .args(["verify", "--user"])
            .arg(unit)
            .env("HOME", root.join("home"))
            .env("XDG_RUNTIME_DIR", root.join("run"))
            .output()
            .unwrap()
    } else {
        stub(&root.join("usr/local/bin/nvlinkd"));
        // `ExecReload=/bin/kill -HUP $MAINPID`.
        stub(&root.join("bin/kill"));
        let units = root.join("usr/lib/systemd/system");
        std::fs::create_dir_all(&units).unwrap();
        for system in ["/usr/lib/systemd/system", "/lib/systemd/system"] {
            for e in std::fs::read_dir(system).into_iter().flatten().flatten() {
                if e.path().extension().is_some_and(|x| x == "target") {
                    let _ = std::fs::copy(e.path(), units.join(e.file_name()));
                }
            }
        }
        let etc = root.join("etc/systemd/system");
        std::fs::create_dir_all(&etc).unwrap();
        std::fs::copy(unit, etc.join(name)).unwrap();
        Command::new("systemd-analyze")
            .args(["verify", "--root"])
            .arg(root)
            .arg(Path::new("/etc/systemd/system").join(name))
            .output()
            .unwrap()
    }
}

#[test]
fn the_systemd_units_verify() {
    if Command::new("systemd-analyze").arg("--version").output().is_err() {
        println!("SKIP: no systemd-analyze (scripts/setup-validators.sh installs it where apt-get runs as root)");
        return;
    }
    let units = [("systemd/nvlinkd-farm.service", false), ("systemd/nvlinkd.service", true)];
    for (unit, user) in units {
        let out = systemd_verify(&deploy(unit), user);
        assert!(out.status.success() && text(&out).trim().is_empty(), "systemd-analyze verify {unit}:\n{}", text(&out));
        // An unknown setting is reported.
        let dir = TempDir::new("deploy-unit");
        let bad = broken(dir.path(), &deploy(unit), |s| s.replace("[Service]\n", "[Service]\nRestartt=always\n"));
        let out = systemd_verify(&bad, user);
        assert!(text(&out).contains("Restartt"), "a unit with an unknown key passed {unit}:\n{}", text(&out));
    }
}

/// `systemd-analyze security` rates the farm unit's exposure at most 2.0 (of
/// 10): a system-call filter, no other ABI, private mounts, hidden processes,
/// peers from private ranges only, umask 0077; the same unit without its
/// system-call filter and address allow list is over.
#[test]
fn the_farm_unit_is_exposed_at_most_2_0() {
    if Command::new("systemd-analyze").arg("--version").output().is_err() {
        println!("SKIP: no systemd-analyze (scripts/setup-validators.sh installs it where apt-get runs as root)");
        return;
    }
    let security = |unit: &Path| {
        Command::new("systemd-analyze")
            .args(["security", "--offline=true", "--threshold=20"])
            .arg(unit)
            .output()
            .unwrap()
    };
    let unit = deploy("systemd/nvlinkd-farm.service");
    let out = security(&unit);
    assert!(out.status.success(), "exposure over 2.0:\n{}", text(&out));
    let dir = TempDir::new("deploy-security");
    let loose = broken(dir.path(), &unit, |s| {
        s.lines().filter(|l| !l.starts_with("SystemCall") && !l.starts_with("IPAddress")).collect::<Vec<_>>().join("\n")
    });
    let out = security(&loose);
    assert!(!out.status.success(), "an unfiltered unit passed:\n{}", text(&out));
}

/// A size in a manifest or a flag (`20Gi`, `12GiB`, `512Mi`), in bytes.
fn bytes(size: &str) -> u64 {
    let split = size.find(|c: char| !c.is_ascii_digit()).unwrap_or(size.len());
    let (n, unit) = size.split_at(split);
    let scale = match unit {
        "Gi" | "GiB" => 1 << 30,
        "Mi" | "MiB" => 1 << 20,
        "" => 1,
        u => panic!("unit {u} in {size}"),
    };
    n.parse::<u64>().unwrap() * scale
}

/// The Deployment's storage holds what its flags allow (a 16 GiB cache and
/// the default 10 GiB of blobs on a 20Gi volume had the kubelet evict the
/// pod): the result cache and the blobs fit the cache volume with room for
/// the log and verification bundles, and the ephemeral-storage limit covers
/// both volumes and the pod's stdout logs.
#[test]
fn the_deployments_storage_holds_what_its_flags_allow() {
    let text = std::fs::read_to_string(deploy("kubernetes/deployment.yaml")).unwrap();
    let flag = |name: &str| {
        let line = text.lines().find_map(|l| l.trim().strip_prefix(&format!("- --{name}=")).map(str::to_owned));
        bytes(&line.unwrap_or_else(|| panic!("no --{name} in the Deployment: its default would apply")))
    };
    // The value on the line after `key` in the block that names `within`.
    let after = |within: &str, key: &str| {
        let start = text.find(within).unwrap_or_else(|| panic!("no {within}"));
        let rest = &text[start..];
        let line = rest.lines().find_map(|l| l.trim().strip_prefix(key).map(|v| v.trim().to_owned()));
        bytes(&line.unwrap_or_else(|| panic!("no {key} after {within}")))
    };
    let (cache, blobs) = (flag("cache-size"), flag("blob-size"));
    let cache_volume = after("- name: cache\n          emptyDir:", "sizeLimit:");
    let tmp_volume = after("- name: tmp\n          emptyDir:", "sizeLimit:");
    let limit = after("limits:", "ephemeral-storage:");
    let headroom = 2 << 30;
    assert!(cache + blobs + headroom <= cache_volume, "cache {cache} + blobs {blobs} + 2 GiB > volume {cache_volume}");
    assert!(cache_volume + tmp_volume + headroom <= limit, "volumes {cache_volume} + {tmp_volume} + 2 GiB > {limit}");
}

/// `deploy/farm.toml` names every option of `nvlinkd serve` (set, or
/// commented with an example), and what it sets is accepted by serve's parser.
#[test]
fn the_farm_config_names_every_serve_option() {
    let text = std::fs::read_to_string(deploy("farm.toml")).unwrap();
    let help = Command::new(nvlinkd_tests::env::nvlinkd()).args(["serve", "--help"]).output().unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    let options: Vec<&str> = help
        .lines()
        .filter_map(|l| l.trim_start().strip_prefix("--"))
        .map(|l| l.split([' ', ',']).next().unwrap_or(""))
        .filter(|o| !["config", "help"].contains(o))
        .collect();
    assert!(options.len() > 30, "{help}");
    for o in options {
        let key = |l: &str| l.trim_start_matches(['#', ' ']).starts_with(&format!("{o} ="));
        assert!(text.lines().any(key), "deploy/farm.toml does not name --{o}");
    }
    // Accepted as a whole: serve's parser takes every key and value (and stops
    // at the missing certificate files, after parsing).
    let out = Command::new(nvlinkd_tests::env::nvlinkd())
        .args(["serve", "--config"])
        .arg(deploy("farm.toml"))
        .env_remove("CUDA_HOME")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("unknown key") && !stderr.contains("error: invalid value"), "{stderr}");
    assert!(!out.status.success(), "serve started from deploy/farm.toml on this machine: {stderr}");
}

/// The CI examples validate against check-jsonschema's bundled schemas
/// (GitHub's workflow syntax, GitLab's CI syntax); each with a misspelt key
/// is refused.
#[test]
fn the_ci_examples_validate_against_their_schemas() {
    let Some(bin) = validators() else { return };
    let check = |schema: &str, file: &Path| {
        Command::new(bin.join("check-jsonschema")).args(["--builtin-schema", schema]).arg(file).output().unwrap()
    };
    let dir = TempDir::new("deploy-ci");
    for (file, schema, (key, typo)) in [
        ("ci/github-actions.yml", "vendor.github-workflows", ("runs-on:", "runs_on:")),
        ("ci/gitlab-ci.yml", "vendor.gitlab-ci", ("  script:", "  scripts:")),
    ] {
        let out = check(schema, &deploy(file));
        assert!(out.status.success(), "check-jsonschema --builtin-schema {schema} deploy/{file}:\n{}", text(&out));
        let bad = broken(dir.path(), &deploy(file), |s| s.replacen(key, typo, 1));
        let out = check(schema, &bad);
        assert!(!out.status.success(), "deploy/{file} with {typo} passed:\n{}", text(&out));
    }
}

/// Each top-level call of a Starlark file (`f(...)`, `x.f(...)`, `x = f(...)`)
/// with its arguments (literals as values, anything else as source text), as
/// JSON, read by Python's parser: Starlark's syntax is Python's. A syntax
/// error exits 2, naming it.
const STARLARK_CALLS: &str = r#"
import ast, json, sys
try:
    tree = ast.parse(open(sys.argv[1]).read(), sys.argv[1])
except SyntaxError as e:
    print(f"{e.filename}:{e.lineno}: {e.msg}", file=sys.stderr)
    sys.exit(2)
def value(node):
    try:
        return ast.literal_eval(node)
    except ValueError:
        return ast.unparse(node)
calls = []
for stmt in tree.body:
    node = stmt.value if isinstance(stmt, (ast.Expr, ast.Assign)) else None
    if isinstance(node, ast.Call):
        target = ast.unparse(stmt.targets[0]) if isinstance(stmt, ast.Assign) else None
        calls.append({"target": target, "func": ast.unparse(node.func), "args": [value(a) for a in node.args],
                      "kwargs": {k.arg: value(k.value) for k in node.keywords}})
print(json.dumps(calls))
"#;

/// The attributes of rules_cuda's `toolkit` tag (`cuda_toolkit_tag` in
/// rules_cuda 0.3.0's `cuda/extensions.bzl`).
const RULES_CUDA_TOOLKIT_ATTRS: [&str; 5] = ["name", "toolkit_path", "components_mapping", "version", "nvcc_version"];

/// The mnemonics of rules_cuda 0.3.0's device-link actions
/// (`cuda/private/actions/dlink.bzl`): nvcc -dlink, and nvlink run directly.
const RULES_CUDA_DLINK_MNEMONICS: [&str; 2] = ["CudaDeviceLink", "nvlink"];

/// What is wrong with the Bazel example in `dir` (`MODULE.bazel`,
/// `BUILD.bazel`, `bazelrc`), given the overlay prefix the doc installs:
/// rules_cuda's toolkit at that overlay, by rules_cuda's real extension,
/// tag and attributes; a `cuda_library` with relocatable device code; the
/// device-link actions run where the shim finds the daemon.
fn bazel_example_problems(dir: &Path, overlay: &str) -> Vec<String> {
    let calls = |file: &str| -> Result<Vec<serde_json::Value>, String> {
        let out = Command::new("python3").arg("-c").arg(STARLARK_CALLS).arg(dir.join(file)).output().unwrap();
        if !out.status.success() {
            return Err(format!("{file} does not parse: {}", text(&out)));
        }
        Ok(serde_json::from_slice::<Vec<serde_json::Value>>(&out.stdout).unwrap())
    };
    let mut problems = Vec::new();
    let named = |calls: &[serde_json::Value], func: &str| -> Vec<serde_json::Value> {
        calls.iter().filter(|c| c["func"] == func).cloned().collect()
    };
    match calls("MODULE.bazel") {
        Err(e) => problems.push(e),
        Ok(module) => {
            if !named(&module, "bazel_dep").iter().any(|c| c["kwargs"]["name"] == "rules_cuda") {
                problems.push("MODULE.bazel: no bazel_dep on rules_cuda".into());
            }
            let extension = named(&module, "use_extension");
            if !extension.iter().any(|c| {
                c["target"] == "cuda"
                    && c["args"] == serde_json::json!(["@rules_cuda//cuda:extensions.bzl", "toolchain"])
            }) {
                problems.push("MODULE.bazel: `cuda` is not rules_cuda's toolchain extension".into());
            }
            let toolkits = named(&module, "cuda.toolkit");
            if toolkits.len() != 1 {
                problems.push(format!("MODULE.bazel: {} cuda.toolkit tags, not one", toolkits.len()));
            }
            for t in &toolkits {
                let kwargs = t["kwargs"].as_object().unwrap();
                for k in kwargs.keys().filter(|k| !RULES_CUDA_TOOLKIT_ATTRS.contains(&k.as_str())) {
                    problems.push(format!("MODULE.bazel: cuda.toolkit has no attribute {k}"));
                }
                if t["kwargs"]["name"] != "cuda" || t["kwargs"]["toolkit_path"] != overlay {
                    problems.push(format!("MODULE.bazel: cuda.toolkit is not `cuda` at {overlay}: {t}"));
                }
            }
            if !named(&module, "use_repo").iter().any(|c| c["args"] == serde_json::json!(["cuda", "cuda"])) {
                problems.push("MODULE.bazel: the `cuda` repository is not used".into());
            }
        }
    }
    match calls("BUILD.bazel") {
        Err(e) => problems.push(e),
        Ok(build) => {
            let loads_library = named(&build, "load").iter().any(|c| {
                c["args"][0] == "@rules_cuda//cuda:defs.bzl"
                    && c["args"].as_array().unwrap().contains(&"cuda_library".into())
            });
            if !loads_library {
                problems.push("BUILD.bazel: cuda_library is not loaded from rules_cuda".into());
            }
            if !named(&build, "cuda_library").iter().any(|c| c["kwargs"]["rdc"] == true) {
                problems.push("BUILD.bazel: no cuda_library with rdc = True (nothing to device-link)".into());
            }
        }
    }
    let rc = std::fs::read_to_string(dir.join("bazelrc")).unwrap_or_default();
    for m in RULES_CUDA_DLINK_MNEMONICS {
        if !rc.lines().any(|l| l.trim() == format!("build --strategy={m}=local")) {
            problems.push(format!("bazelrc: the {m} actions are not run outside the sandbox"));
        }
    }
    problems
}

/// The Bazel example (rules_cuda on an nvlinkd overlay) parses and names
/// rules_cuda's real extension, tag and attributes, the overlay prefix that
/// docs/build-ways.md installs, and the device-link actions; copies with a
/// syntax error, a misspelt attribute, another toolkit path or a sandboxed
/// device link are each refused. Not run with Bazel: Bazel cannot be
/// installed here (see the doc).
#[test]
fn the_bazel_example_points_rules_cuda_at_the_overlay() {
    if Command::new("python3").arg("--version").output().is_err() {
        println!("SKIP: no python3 to parse the Bazel example with");
        return;
    }
    let doc = std::fs::read_to_string(repo_root().join("docs/build-ways.md")).unwrap();
    let bazel = &doc[doc.find("## Bazel").expect("docs/build-ways.md has no Bazel section")..];
    let overlay = bazel
        .split_whitespace()
        .skip_while(|w| *w != "--prefix")
        .nth(1)
        .expect("the Bazel section installs no overlay (--prefix)");
    let problems = bazel_example_problems(&deploy("bazel"), overlay);
    assert!(problems.is_empty(), "deploy/bazel/:\n{}", problems.join("\n"));
    type Edit = fn(&str) -> String;
    let edits: [(&str, Edit); 4] = [
        ("MODULE.bazel", |s| s.replace("use_repo(cuda, \"cuda\")", "use_repo(cuda, \"cuda\"")),
        ("MODULE.bazel", |s| s.replace("toolkit_path =", "toolkit_pth =")),
        ("MODULE.bazel", |s| s.replace("/opt/cuda-nvlinkd", "/usr/local/cuda")),
        ("bazelrc", |s| s.replace("--strategy=nvlink=local", "--strategy=nvlink=sandboxed")),
    ];
    for (i, (file, edit)) in edits.into_iter().enumerate() {
        let dir = TempDir::new("deploy-bazel");
        for f in ["MODULE.bazel", "BUILD.bazel", "bazelrc"] {
            std::fs::copy(deploy("bazel").join(f), dir.path().join(f)).unwrap();
        }
        broken(dir.path(), &deploy("bazel").join(file), edit);
        let problems = bazel_example_problems(dir.path(), overlay);
        assert!(!problems.is_empty(), "{file} broken by edit {i} passed");
        println!("broken {file} (edit {i}) refused: {}", problems.join("; "));
    }
}
