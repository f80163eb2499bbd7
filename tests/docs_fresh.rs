//! The committed man pages and shell completions are exactly what the
//! current command tree generates.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

const REGENERATE: &str = "regenerate them with `cargo run -- generate-docs --out .` \
     from the repository's top level, then commit man/ and completions/";

fn files_under(root: &Path, dir: &str) -> BTreeMap<String, Vec<u8>> {
    let mut files = BTreeMap::new();
    let Ok(entries) = std::fs::read_dir(root.join(dir)) else {
        return files;
    };
    for entry in entries {
        let entry = entry.expect("read a directory entry");
        if entry.file_type().expect("file type").is_file() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let bytes = std::fs::read(entry.path()).expect("read a generated file");
            files.insert(format!("{dir}/{name}"), bytes);
        }
    }
    files
}

#[test]
fn man_pages_and_completions_are_fresh() {
    let out = tempfile::tempdir().expect("temp dir");
    let run = Command::new(env!("CARGO_BIN_EXE_saguin"))
        .args(["generate-docs", "--out"])
        .arg(out.path())
        .output()
        .expect("run saguin generate-docs");
    assert!(
        run.status.success(),
        "saguin generate-docs failed: {}",
        String::from_utf8_lossy(&run.stderr)
    );

    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut generated = files_under(out.path(), "man");
    generated.extend(files_under(out.path(), "completions"));
    let mut committed = files_under(repo, "man");
    committed.extend(files_under(repo, "completions"));

    for expected in [
        "man/saguin.1",
        "man/saguin-check-config.1",
        "man/saguin-snapshot-verify.1",
        "completions/saguin.bash",
        "completions/_saguin",
        "completions/saguin.fish",
    ] {
        assert!(
            generated.contains_key(expected),
            "the generator did not write {expected}: {:?}",
            generated.keys()
        );
    }

    let mut stale = Vec::new();
    for (name, bytes) in &generated {
        match committed.get(name) {
            None => stale.push(format!("{name} is missing")),
            Some(old) if old != bytes => stale.push(format!("{name} differs")),
            Some(_) => {}
        }
    }
    for name in committed.keys() {
        if !generated.contains_key(name) {
            stale.push(format!("{name} is no longer generated"));
        }
    }
    assert!(
        stale.is_empty(),
        "the man pages and shell completions are stale ({}); {REGENERATE}",
        stale.join("; ")
    );
}

#[test]
fn the_generator_is_hidden_from_users() {
    let out = Command::new(env!("CARGO_BIN_EXE_saguin"))
        .arg("--help")
        .output()
        .expect("run saguin --help");
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(help.contains("check-config"), "{help}");
    assert!(!help.contains("generate-docs"), "{help}");

    let out = tempfile::tempdir().expect("temp dir");
    let run = Command::new(env!("CARGO_BIN_EXE_saguin"))
        .args(["generate-docs", "--out"])
        .arg(out.path())
        .output()
        .expect("run saguin generate-docs");
    assert!(run.status.success());
    for file in [
        "completions/saguin.bash",
        "completions/_saguin",
        "completions/saguin.fish",
    ] {
        let text = std::fs::read_to_string(out.path().join(file)).expect("read a completion");
        assert!(
            !text.contains("generate-docs"),
            "{file} offers the hidden command"
        );
        assert!(text.contains("check-config"), "{file} lacks check-config");
    }
    assert!(!out.path().join("man/saguin-generate-docs.1").exists());
}
