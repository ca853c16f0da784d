//! `nvlinkd serve --config FILE` (and `start`): options from a TOML file.
//!
//! Keys are `serve`'s long options without their dashes (`socket`,
//! `cache-dir`, `listen`, `jobs`, ...); a string or number is the option's
//! value, `true` gives a switch (`watch = true`), `false` leaves it off, and
//! an array repeats the option (`cuda-home = ["/opt/cuda-13.5", "/opt/cuda-13.0"]`).
//! An option on the command line overrides the file's (a list option from the
//! command line replaces the file's list). The file becomes arguments placed
//! after the command line's, so clap checks every value as it checks a flag;
//! an unknown key, a table, or a wrong type is refused with the file and key
//! named. `deploy/farm.toml` shows every key.

use std::path::Path;

/// `argv` with the options of the file its `--config` names added; unchanged
/// for other commands or without `--config`.
pub fn expand(argv: Vec<String>, serve: &clap::Command) -> Result<Vec<String>, String> {
    if !matches!(argv.get(1).map(String::as_str), Some("serve" | "start")) {
        return Ok(argv);
    }
    let mut file = None;
    let mut it = argv.iter().skip(2);
    while let Some(a) = it.next() {
        if a == "--" {
            break;
        }
        if a == "--config" {
            file = it.next().cloned();
        } else if let Some(v) = a.strip_prefix("--config=") {
            file = Some(v.to_owned());
        }
    }
    let Some(file) = file else { return Ok(argv) };
    let extra = options(Path::new(&file), serve, &argv[2..])?;
    let mut out = argv;
    out.extend(extra);
    Ok(out)
}

/// The file's options as arguments, less those `given` on the command line.
fn options(file: &Path, serve: &clap::Command, given: &[String]) -> Result<Vec<String>, String> {
    let shown = file.display();
    let text = std::fs::read_to_string(file).map_err(|e| format!("cannot read {shown}: {e}"))?;
    let table: toml::Table = text.parse().map_err(|e| format!("{shown}: {e}"))?;
    let known: Vec<&str> =
        serve.get_arguments().filter_map(|a| a.get_long()).filter(|l| *l != "config" && *l != "detached").collect();
    let mut out = Vec::new();
    for (key, value) in &table {
        if !known.contains(&key.as_str()) {
            return Err(format!("{shown}: unknown key '{key}' (keys are serve's long options: {})", known.join(", ")));
        }
        let flag = format!("--{key}");
        if given.iter().any(|a| *a == flag || a.starts_with(&format!("{flag}="))) {
            continue;
        }
        let scalar = |v: &toml::Value| -> Result<Option<String>, String> {
            match v {
                toml::Value::String(s) => Ok(Some(format!("{flag}={s}"))),
                toml::Value::Integer(n) => Ok(Some(format!("{flag}={n}"))),
                toml::Value::Float(x) => Ok(Some(format!("{flag}={x}"))),
                toml::Value::Boolean(true) => Ok(Some(flag.clone())),
                toml::Value::Boolean(false) => Ok(None),
                _ => Err(format!("{shown}: '{key}' must be a string, a number, true/false or a list of them")),
            }
        };
        match value {
            toml::Value::Array(items) => {
                for v in items {
                    out.extend(scalar(v)?);
                }
            }
            v => out.extend(scalar(v)?),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn serve() -> clap::Command {
        clap::Command::new("serve")
            .arg(clap::Arg::new("jobs").long("jobs"))
            .arg(clap::Arg::new("cuda-home").long("cuda-home").action(clap::ArgAction::Append))
            .arg(clap::Arg::new("watch").long("watch").action(clap::ArgAction::SetTrue))
            .arg(clap::Arg::new("no-speculate").long("no-speculate").action(clap::ArgAction::SetTrue))
    }

    fn with_file(text: &str, args: &[&str]) -> Result<Vec<String>, String> {
        let dir = std::env::temp_dir().join(format!("nvlinkd-config-{}-{}", std::process::id(), text.len()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("farm.toml");
        std::fs::write(&file, text).unwrap();
        let mut argv: Vec<String> = ["nvlinkd", "serve", "--config"].map(str::to_owned).to_vec();
        argv.push(file.display().to_string());
        argv.extend(args.iter().map(|a| a.to_string()));
        let out = expand(argv, &serve()).map(|v| v[4..].to_vec());
        let _ = std::fs::remove_dir_all(&dir);
        out
    }

    #[test]
    fn keys_become_options_and_the_command_line_wins() {
        let file = "jobs = 4\ncuda-home = [\"/a\", \"/b\"]\nwatch = true\nno-speculate = false\n";
        // (Keys in the order of a sorted table.)
        assert_eq!(with_file(file, &[]).unwrap(), ["--cuda-home=/a", "--cuda-home=/b", "--jobs=4", "--watch"]);
        assert_eq!(
            with_file(file, &["--jobs", "8", "--cuda-home=/c"]).unwrap(),
            ["--jobs", "8", "--cuda-home=/c", "--watch"]
        );
    }

    #[test]
    fn unknown_keys_tables_and_bad_toml_are_refused_by_name() {
        let e = with_file("jbos = 4\n", &[]).unwrap_err();
        assert!(e.contains("unknown key 'jbos'") && e.contains("jobs"), "{e}");
        let e = with_file("[jobs]\nn = 1\n", &[]).unwrap_err();
        assert!(e.contains("'jobs' must be"), "{e}");
        assert!(with_file("jobs = \n", &[]).unwrap_err().contains("farm.toml"));
    }
}
