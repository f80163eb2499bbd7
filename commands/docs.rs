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
            "man" => name.starts_with("saguin") && name.ends_with(".1"),
            _ => name.starts_with("saguin.") || name == "_saguin",
        };
        if generated_kind && !files.contains_key(&format!("{dir_name}/{name}")) {
            std::fs::remove_file(entry.path())
                .with_context(|| format!("remove stale {}", entry.path().display()))?;
        }
    }
    Ok(())
}
