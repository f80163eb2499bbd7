//! `saguin generate-docs --out DIR` (hidden): write the man pages and the
//! shell completions, both generated from the clap tree, into `DIR/man` and
//! `DIR/completions`. The committed copies are checked by
//! `tests/docs_fresh.rs`; regenerate with `cargo run -- generate-docs --out .`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::CommandFactory;
use clap_complete::Shell;

use crate::exit;

/// Write man pages (one per command, nested ones included) and bash, zsh
/// and fish completions.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The directory to write `man/` and `completions/` into (the
    /// repository's top level to refresh the committed copies).
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
}

pub fn run(args: Args) -> anyhow::Result<u8> {
    let files = generate()?;
    for dir in ["man", "completions"] {
        let dir = args.out.join(dir);
        std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
        remove_stale(&dir, &files)?;
    }
    for (relative, bytes) in &files {
        let path = args.out.join(relative);
        std::fs::write(&path, bytes).with_context(|| format!("write {}", path.display()))?;
    }
    println!(
        "wrote {} files into {} and {}",
        files.len(),
        args.out.join("man").display(),
        args.out.join("completions").display()
    );
    Ok(exit::OK)
}

/// Every generated file, by its path relative to the output directory.
pub fn generate() -> anyhow::Result<BTreeMap<String, Vec<u8>>> {
    let mut files = BTreeMap::new();
    let mut cmd = crate::Cli::command().disable_help_subcommand(true);
    cmd.build();
    man_pages(&cmd, &mut files)?;
    files.insert(
        "man/saguin-config.5".to_string(),
        config_reference().into_bytes(),
    );
    let completed = without_hidden(&crate::Cli::command());
    for (shell, name) in [
        (Shell::Bash, "saguin.bash"),
        (Shell::Zsh, "_saguin"),
        (Shell::Fish, "saguin.fish"),
    ] {
        let mut bytes = Vec::new();
        clap_complete::generate(shell, &mut completed.clone(), "saguin", &mut bytes);
        files.insert(format!("completions/{name}"), bytes);
    }
    Ok(files)
}

/// The command tree without its hidden subcommands: the completion
/// generators list hidden subcommands, and a user has no use for
/// `generate-docs`.
fn without_hidden(cmd: &clap::Command) -> clap::Command {
    let mut out = clap::Command::new("saguin")
        .version(env!("CARGO_PKG_VERSION"))
        .propagate_version(true)
        .subcommand_required(true)
        .arg_required_else_help(true);
    if let Some(about) = cmd.get_about() {
        out = out.about(about.clone());
    }
    for arg in cmd.get_arguments() {
        out = out.arg(arg.clone());
    }
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        out = out.subcommand(sub.clone());
    }
    out
}

fn man_pages(cmd: &clap::Command, files: &mut BTreeMap<String, Vec<u8>>) -> anyhow::Result<()> {
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        man_pages(sub, files)?;
    }
    let man = clap_mangen::Man::new(cmd.clone());
    let mut bytes = Vec::new();
    man.render(&mut bytes)
        .with_context(|| format!("render the man page of {}", cmd.get_name()))?;
    files.insert(format!("man/{}", man.get_filename()), bytes);
    Ok(())
}

/// Remove files this generator wrote before and no longer writes (a
/// subcommand that was removed), leaving anything else alone.
fn remove_stale(dir: &Path, files: &BTreeMap<String, Vec<u8>>) -> anyhow::Result<()> {
    let Some(dir_name) = dir.file_name().and_then(|n| n.to_str()) else {
        return Ok(());
    };
    for entry in std::fs::read_dir(dir).with_context(|| format!("read {}", dir.display()))? {
        let entry = entry.with_context(|| format!("read {}", dir.display()))?;
        let Some(name) = entry.file_name().to_str().map(str::to_string) else {
            continue;
        };
        let generated_kind = match dir_name {
            "man" => name.starts_with("saguin") && (name.ends_with(".1") || name.ends_with(".5")),
            _ => name.starts_with("saguin.") || name == "_saguin",
        };
        if generated_kind && !files.contains_key(&format!("{dir_name}/{name}")) {
            std::fs::remove_file(entry.path())
                .with_context(|| format!("remove stale {}", entry.path().display()))?;
        }
    }
    Ok(())
}

/// The commented example configuration, shown in the reference.
const EXAMPLE_CONFIG: &str = include_str!("../fixtures/config/example.yaml");

/// `saguin-config(5)`: every configuration key, from the library's
/// reference list, and the example configuration.
fn config_reference() -> String {
    let mut page = String::new();
    page.push_str(&format!(
        ".TH saguin-config 5 \"saguin {}\"\n",
        env!("CARGO_PKG_VERSION")
    ));
    page.push_str(".SH NAME\nsaguin\\-config \\- the saguin configuration file\n");
    page.push_str(".SH DESCRIPTION\n");
    for paragraph in [
        "One YAML file, read by saguin serve --config FILE and checked by saguin check-config --config FILE, which run the same loader. Unknown keys are errors. Every problem is reported with its YAML path, for example channels[2].storage: no provider named \"db2\".",
        "Sizes are a whole number of bytes (1000) or a whole number and a unit: B, KB, MB, GB, TB are powers of 1000, KiB, MiB, GiB, TiB powers of 1024 (10MB is 10000000 bytes, 10MiB 10485760); fractions are refused. The same syntax is read by every --max-bytes option.",
        "Durations are humantime: 150ms, 30s, 5m, 1h, 7d, 1h 30m; a bare number is refused; none is longer than 4294967295s (about 136 years).",
        "Relative paths resolve against the configuration file's directory. Files the configuration names (password file, ACL file, certificates, keys) are opened and parsed at load time; the databases and snapshot directories are not.",
        "In the list below, [] marks the items of a list (listeners[].bind is the bind of each listener).",
    ] {
        page.push_str(".PP\n");
        page.push_str(&roff_text(paragraph));
        page.push('\n');
    }
    page.push_str(".SH KEYS\n");
    for key in saguin::config::reference::keys() {
        page.push_str(&format!(
            ".TP\n\\fB{}\\fR ({})\n",
            roff_text(key.path),
            roff_text(key.kind)
        ));
        page.push_str(&roff_text(key.meaning));
        page.push('\n');
        match key.default.strip_prefix("required") {
            Some(rest) => page.push_str(&format!(".br\nRequired{}.\n", roff_text(rest))),
            None if !key.default.is_empty() => {
                page.push_str(&format!(".br\nDefault: {}.\n", roff_text(&key.default)))
            }
            None => {}
        }
        if !key.bounds.is_empty() {
            page.push_str(&format!(".br\nAccepted: {}.\n", roff_text(&key.bounds)));
        }
    }
    page.push_str(".SH EXAMPLE\n.nf\n");
    for line in EXAMPLE_CONFIG.lines() {
        page.push_str(&roff_text(line));
        page.push('\n');
    }
    page.push_str(".fi\n");
    page.push_str(
        ".SH SEE ALSO\nsaguin\\-check\\-config(1), saguin\\-serve(1), saguin\\-passwd(1)\n",
    );
    page
}

/// Text made safe as roff: backslashes and hyphens escaped, and a line
/// that would start with a control character (`.` or `\'`) guarded.
fn roff_text(text: &str) -> String {
    let escaped = text.replace('\\', "\\e").replace('-', "\\-");
    if escaped.starts_with('.') || escaped.starts_with('\'') {
        format!("\\&{escaped}")
    } else {
        escaped
    }
}
