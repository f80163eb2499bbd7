//! Stamps the build's revision into `SAGUIN_REVISION` : the writer recorded in every file is the build's own
//! revision, read from the binary rather than written down. From a git checkout it is the 12-digit abbreviated
//! commit; outside one, `v` and the crate version.

use std::path::{Path, PathBuf};
use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git")
        .args(args)
        .current_dir(env_path("CARGO_MANIFEST_DIR"))
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8(out.stdout).ok()?;
    let text = text.trim();
    (!text.is_empty()).then(|| text.to_string())
}

fn env_path(key: &str) -> PathBuf {
    PathBuf::from(std::env::var_os(key).unwrap_or_default())
}

fn watch(path: &str) {
    let path = Path::new(path);
    let path = if path.is_absolute() {
        path.to_path_buf()
    } else {
        env_path("CARGO_MANIFEST_DIR").join(path)
    };
    if path.exists() {
        println!("cargo:rerun-if-changed={}", path.display());
    }
}

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let revision = match git(&["rev-parse", "--short=12", "HEAD"]) {
        Some(rev) => {
            // HEAD moves on checkout; the branch ref (loose or packed) moves
            // on commit. In a worktree these live in different git dirs,
            // which `--git-path` resolves.
            if let Some(head) = git(&["rev-parse", "--git-path", "HEAD"]) {
                watch(&head);
            }
            if let Some(reference) = git(&["symbolic-ref", "-q", "HEAD"]) {
                if let Some(path) = git(&["rev-parse", "--git-path", &reference]) {
                    watch(&path);
                }
            }
            if let Some(packed) = git(&["rev-parse", "--git-path", "packed-refs"]) {
                watch(&packed);
            }
            rev
        }
        None => format!(
            "v{}",
            std::env::var("CARGO_PKG_VERSION").unwrap_or_default()
        ),
    };
    println!("cargo:rustc-env=SAGUIN_REVISION={revision}");
}
