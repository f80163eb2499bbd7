//! The documentation's command blocks, run as written against a real
//! broker: the README's tour, `docs/channels.md` and `docs/operations.md`.
//!
//! A page's runnable parts, in page order:
//!
//! - a fenced block whose info string names a file (```` ```yaml
//!   file=saguin.yaml ````) is written into the page's working directory;
//! - a ```` ```console ```` block holds commands, each on a line starting
//!   `$ ` (a line ending in `\` continues it), followed by the standard
//!   output it prints; `[..]` in an expected line stands for any text, a
//!   line `...` for any number of lines. Every command must exit 0;
//! - `<!-- doc-test: wait-metric SAMPLE VALUE -->` waits until the
//!   broker's `/metrics` shows the sample at that value (what a reader
//!   waits a moment for, such as a retention sweep).
//!
//! The commands run one after another in one `bash`, so `cd`, `&`, `%1`
//! and `wait` work as they do at a terminal. The page's configuration
//! binds 127.0.0.1:1883 and metrics 127.0.0.1:9464; the files written here
//! bind port 0 instead, and once a `saguin serve ... 2> saguin.log &`
//! command has started the broker, its log's `listening` lines give the
//! ports that stand for 1883 and 9464 in every later command, file and
//! expected line.

mod broker_support;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use broker_support::{field, have_mosquitto_clients, say_skipped};

/// The longest one command may take: a worker waiting out a backoff, a
/// broker writing its snapshots at a stop.
const COMMAND_WAIT: Duration = Duration::from_secs(60);
/// The longest a broker may take to listen, or a metric to reach a value.
const EVENT_WAIT: Duration = Duration::from_secs(30);
/// The line each command's end is told by.
const DONE: &str = "__SAGUIN_DOC_TEST_DONE__";

/// The ports a page names, and what the tests serve them on instead.
const MQTT_PORT: &str = "1883";
const METRICS_PORT: &str = "9464";

/// One runnable part of a page.
#[derive(Debug)]
enum Step {
    File {
        name: String,
        text: String,
        line: usize,
    },
    Command {
        command: String,
        expected: Vec<String>,
        line: usize,
    },
    WaitMetric {
        sample: String,
        value: f64,
        line: usize,
    },
}

/// The runnable parts of `page`, in order.
fn steps(page: &str) -> Vec<Step> {
    let mut steps = Vec::new();
    let mut lines = page.lines().enumerate().peekable();
    while let Some((i, line)) = lines.next() {
        let number = i + 1;
        if let Some(directive) = line
            .trim()
            .strip_prefix("<!-- doc-test:")
            .and_then(|d| d.strip_suffix("-->"))
        {
            let words: Vec<&str> = directive.split_whitespace().collect();
            match words.as_slice() {
                ["wait-metric", sample, value] => steps.push(Step::WaitMetric {
                    sample: (*sample).to_owned(),
                    value: value.parse().unwrap_or_else(|_| {
                        panic!("line {number}: wait-metric value {value:?} is not a number")
                    }),
                    line: number,
                }),
                _ => panic!("line {number}: unknown doc-test directive {directive:?}"),
            }
            continue;
        }
        let Some(info) = line.strip_prefix("```") else {
            continue;
        };
        let mut words = info.split_whitespace();
        let lang = words.next().unwrap_or_default().to_owned();
        let file = words
            .find_map(|w| w.strip_prefix("file="))
            .map(str::to_owned);
        let mut body = Vec::new();
        for (_, line) in lines.by_ref() {
            if line.starts_with("```") {
                break;
            }
            body.push(line);
        }
        if let Some(name) = file {
            let mut text = body.join("\n");
            text.push('\n');
            steps.push(Step::File {
                name,
                text,
                line: number,
            });
        } else if lang == "console" {
            let mut body = body.into_iter().enumerate().peekable();
            while let Some((j, line)) = body.next() {
                let Some(first) = line.strip_prefix("$ ") else {
                    panic!(
                        "line {}: output before any command in a console block: {line:?}",
                        number + 1 + j
                    );
                };
                let mut command = first.to_owned();
                while command.ends_with('\\') {
                    let (_, next) = body.next().expect("a continued command goes on");
                    command.push('\n');
                    command.push_str(next);
                }
                let mut expected = Vec::new();
                while let Some((_, next)) = body.peek() {
                    if next.starts_with("$ ") {
                        break;
                    }
                    expected.push((*next).to_owned());
                    body.next();
                }
                steps.push(Step::Command {
                    command,
                    expected,
                    line: number + 1 + j,
                });
            }
        }
    }
    steps
}

/// Does `actual` match `expected`, `[..]` any text within a line and a
/// line `...` any number of lines?
fn lines_match(expected: &[String], actual: &[String]) -> bool {
    match expected.split_first() {
        None => actual.is_empty(),
        Some((first, rest)) if first == "..." => {
            (0..=actual.len()).any(|skip| lines_match(rest, &actual[skip..]))
        }
        Some((first, rest)) => match actual.split_first() {
            Some((line, more)) => line_matches(first, line) && lines_match(rest, more),
            None => false,
        },
    }
}

fn line_matches(expected: &str, actual: &str) -> bool {
    let parts: Vec<&str> = expected.split("[..]").collect();
    if parts.len() == 1 {
        return expected == actual;
    }
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    if !actual.starts_with(first) || actual.len() < first.len() + last.len() {
        return false;
    }
    let mut rest = &actual[first.len()..];
    for part in &parts[1..parts.len() - 1] {
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    rest.ends_with(last)
}

/// A page's commands running in one `bash` of their own process group.
struct Session {
    dir: tempfile::TempDir,
    bash: Child,
    stdin: ChildStdin,
    output: mpsc::Receiver<String>,
    /// What stands for 1883 and 9464 now.
    ports: HashMap<&'static str, u16>,
    transcript: Vec<String>,
}

impl Session {
    fn start() -> Session {
        let dir = tempfile::tempdir().expect("temp dir");
        let bin = Path::new(env!("CARGO_BIN_EXE_saguin"))
            .parent()
            .expect("the binary's directory")
            .to_path_buf();
        let path = std::env::join_paths(std::iter::once(bin).chain(std::env::split_paths(
            &std::env::var_os("PATH").unwrap_or_default(),
        )))
        .expect("PATH");
        let stderr = std::fs::File::create(dir.path().join("bash.stderr")).expect("stderr file");
        let mut bash = Command::new("bash")
            .args(["--noprofile", "--norc"])
            .current_dir(dir.path())
            .env("PATH", path)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(stderr)
            // Its own group, so whatever a page left running is ended with
            // it.
            .process_group(0)
            .spawn()
            .expect("start bash");
        let stdin = bash.stdin.take().expect("stdin");
        let stdout = bash.stdout.take().expect("stdout");
        let (tx, output) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Session {
            dir,
            bash,
            stdin,
            output,
            ports: HashMap::new(),
            transcript: Vec::new(),
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// `text` with the page's ports replaced by the ones serving now.
    fn substitute(&self, text: &str, line: usize) -> String {
        let mut text = text.to_owned();
        for (page_port, key) in [(MQTT_PORT, "mqtt"), (METRICS_PORT, "metrics")] {
            if text.contains(page_port) {
                let port = self.ports.get(key).unwrap_or_else(|| {
                    panic!("line {line}: {page_port} is named before a broker listens on it")
                });
                text = text.replace(page_port, &port.to_string());
            }
        }
        text
    }

    fn write_file(&mut self, name: &str, text: &str, line: usize) {
        let text = if name.ends_with(".yaml") {
            // The system picks the ports; the broker's log says which.
            text.replace(&format!("127.0.0.1:{MQTT_PORT}"), "127.0.0.1:0")
                .replace(&format!("127.0.0.1:{METRICS_PORT}"), "127.0.0.1:0")
        } else {
            self.substitute(text, line)
        };
        std::fs::write(self.path(name), text).expect("write a page's file");
        self.transcript.push(format!("(wrote {name})"));
    }

    /// Runs `command`, returning its standard output's lines and its exit
    /// status.
    fn run(&mut self, command: &str) -> (Vec<String>, i32) {
        self.transcript.push(format!("$ {command}"));
        writeln!(
            self.stdin,
            "{{ {command}\n}} < /dev/null\nprintf '\\n{DONE} %s\\n' \"$?\""
        )
        .expect("send a command to bash");
        self.stdin.flush().expect("flush");
        let deadline = Instant::now() + COMMAND_WAIT;
        let mut lines = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.output.recv_timeout(left) {
                Ok(line) => {
                    if let Some(status) = line.strip_prefix(DONE) {
                        // The newline printed before the marker.
                        if lines.last().is_some_and(String::is_empty) {
                            lines.pop();
                        }
                        let status = status.trim().parse().expect("an exit status");
                        self.transcript.extend(lines.iter().cloned());
                        return (lines, status);
                    }
                    lines.push(line);
                }
                Err(_) => {
                    self.transcript.extend(lines.iter().cloned());
                    self.fail(&format!(
                        "`{command}` did not finish within {COMMAND_WAIT:?}"
                    ));
                }
            }
        }
    }

    /// After `saguin serve ... 2> saguin.log &`: waits for this start's
    /// `listening` lines and takes the ports from them. `before` is what
    /// the log held before the command (a start may append to it or
    /// truncate it).
    fn wait_for_listeners(&mut self, before: &str) {
        let log = self.path("saguin.log");
        let config = std::fs::read_to_string(self.path("saguin.yaml")).unwrap_or_default();
        let mut wanted = vec!["mqtt"];
        if config.contains("\nmetrics:") {
            wanted.push("metrics");
        }
        let deadline = Instant::now() + EVENT_WAIT;
        loop {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            // This start's lines: those after its `starting` line, in
            // what the command added to the log.
            let added = text.strip_prefix(before).unwrap_or(&text);
            let this_start = added.find("msg=\"starting\"").map_or("", |at| &added[at..]);
            if this_start.contains("msg=\"cannot start\"") {
                self.fail("the broker did not start");
            }
            let mut found = HashMap::new();
            for line in this_start
                .lines()
                .filter(|l| l.contains("msg=\"listening\""))
            {
                if let (Some(name), Some(addr)) = (field(line, "listener"), field(line, "addr")) {
                    let port: u16 = addr.rsplit(':').next().unwrap().parse().unwrap();
                    found.insert(name, port);
                }
            }
            if wanted.iter().all(|w| found.contains_key(*w)) {
                self.ports.insert("mqtt", found["mqtt"]);
                if let Some(port) = found.get("metrics") {
                    self.ports.insert("metrics", *port);
                }
                return;
            }
            if Instant::now() > deadline {
                self.fail("the broker did not listen within the wait");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits until `/metrics` shows `sample` at `value`.
    fn wait_metric(&mut self, sample: &str, value: f64, line: usize) {
        let endpoint = format!(
            "127.0.0.1:{}",
            self.ports
                .get("metrics")
                .unwrap_or_else(|| panic!("line {line}: no metrics listener yet"))
        );
        let (name, labels) = sample.split_once('{').unwrap_or((sample, ""));
        let labels: Vec<(String, String)> = labels
            .trim_end_matches('}')
            .split(',')
            .filter(|l| !l.is_empty())
            .map(|l| {
                let (k, v) = l.split_once('=').expect("label=value");
                (k.to_owned(), v.trim_matches('"').to_owned())
            })
            .collect();
        let deadline = Instant::now() + EVENT_WAIT;
        loop {
            let answer = saguin::broker::status::http_get(&endpoint, "/metrics")
                .unwrap_or_else(|e| panic!("line {line}: {e}"));
            let samples = saguin::broker::status::parse_text(&answer.body)
                .unwrap_or_else(|e| panic!("line {line}: {e:?}"));
            let last = samples
                .iter()
                .find(|s| {
                    s.name == name && labels.iter().all(|(k, v)| s.label(k) == Some(v.as_str()))
                })
                .map(|s| s.value);
            if last == Some(value) {
                self.transcript
                    .push(format!("(waited for {sample} {value})"));
                return;
            }
            if Instant::now() > deadline {
                self.fail(&format!(
                    "line {line}: {sample} was {last:?}, not {value}, within {EVENT_WAIT:?}"
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn fail(&mut self, why: &str) -> ! {
        let stderr = std::fs::read_to_string(self.path("bash.stderr")).unwrap_or_default();
        let log = std::fs::read_to_string(self.path("saguin.log")).unwrap_or_default();
        panic!(
            "{why}\n--- transcript\n{}\n--- standard error\n{stderr}\n--- saguin.log\n{log}",
            self.transcript.join("\n")
        );
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        // Whatever the page left running (a broker after a failure).
        unsafe {
            libc::kill(-(self.bash.id() as i32), libc::SIGKILL);
        }
        let _ = self.bash.wait();
    }
}

/// Runs every step of the page at `relative` (from the repository's top).
fn run_page(relative: &str) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(relative);
    let page = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{relative}: {e}"));
    let steps = steps(&page);
    let commands = steps
        .iter()
        .filter(|s| matches!(s, Step::Command { .. }))
        .count();
    assert!(commands >= 5, "{relative}: only {commands} commands found");
    let mut session = Session::start();
    for step in &steps {
        match step {
            Step::File { name, text, line } => session.write_file(name, text, *line),
            Step::WaitMetric {
                sample,
                value,
                line,
            } => session.wait_metric(sample, *value, *line),
            Step::Command {
                command,
                expected,
                line,
            } => {
                let typed = session.substitute(command, *line);
                let log_before =
                    std::fs::read_to_string(session.path("saguin.log")).unwrap_or_default();
                let (actual, status) = session.run(&typed);
                let starts_a_broker =
                    command.contains("saguin serve") && command.trim_end().ends_with('&');
                if status != 0 {
                    session.fail(&format!("{relative}:{line}: `{command}` exited {status}"));
                }
                if starts_a_broker {
                    assert!(
                        command.contains("saguin.log"),
                        "{relative}:{line}: a broker started by a page logs to saguin.log"
                    );
                    session.wait_for_listeners(&log_before);
                }
                let expected: Vec<String> = expected
                    .iter()
                    .map(|l| session.substitute(l, *line))
                    .collect();
                if !lines_match(&expected, &actual) {
                    session.fail(&format!(
                        "{relative}:{line}: `{command}` printed\n{}\nwhere the page shows\n{}",
                        actual.join("\n"),
                        expected.join("\n")
                    ));
                }
            }
        }
    }
}

/// Can the page's tools run here? When not, say so loudly.
fn have_tools(test: &str, python: bool) -> bool {
    if !have_mosquitto_clients(test) {
        return false;
    }
    let runs = |program: &str, args: &[&str]| {
        Command::new(program)
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    if !runs("curl", &["--version"]) {
        say_skipped(test, "curl not installed (apt-get install curl)");
        return false;
    }
    if python && !runs("python3", &["-c", "import paho.mqtt.client"]) {
        say_skipped(
            test,
            "python3 with paho-mqtt not installed (pip install paho-mqtt)",
        );
        return false;
    }
    true
}

#[test]
fn the_readme_tour_runs_as_shown() {
    if have_tools("the_readme_tour_runs_as_shown", false) {
        run_page("README.md");
    }
}

#[test]
fn the_channels_page_runs_as_shown() {
    if have_tools("the_channels_page_runs_as_shown", true) {
        run_page("docs/channels.md");
    }
}

#[test]
fn the_operations_page_runs_as_shown() {
    if have_tools("the_operations_page_runs_as_shown", false) {
        run_page("docs/operations.md");
    }
}

#[test]
fn expected_output_matches_with_wildcards_and_skipped_lines() {
    let lines = |text: &[&str]| text.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
    assert!(lines_match(&lines(&["a [..] c"]), &lines(&["a b c"])));
    assert!(!lines_match(&lines(&["a [..] c"]), &lines(&["a b d"])));
    assert!(lines_match(
        &lines(&["x", "...", "z"]),
        &lines(&["x", "1", "2", "z"])
    ));
    assert!(lines_match(&lines(&["x", "...", "z"]), &lines(&["x", "z"])));
    assert!(!lines_match(&lines(&["x"]), &lines(&["x", "y"])));
    assert!(!lines_match(&lines(&["[..]ab[..]ab"]), &lines(&["ab"])));
    let parsed = steps(
        "```yaml file=a.yaml\nk: v\n```\n<!-- doc-test: wait-metric m{c=\"x\"} 7 -->\n\
         ```console\n$ echo one \\\n  two\none two\n$ true\n```\n",
    );
    assert!(
        matches!(&parsed[0], Step::File { name, text, .. } if name == "a.yaml" && text == "k: v\n")
    );
    assert!(matches!(&parsed[1], Step::WaitMetric { value, .. } if *value == 7.0));
    assert!(
        matches!(&parsed[2], Step::Command { command, expected, .. } if command == "echo one \\\n  two" && expected == &["one two"])
    );
    assert!(matches!(&parsed[3], Step::Command { expected, .. } if expected.is_empty()));
}

/// A heading's anchor as GitHub makes it: lower case, spaces to `-`,
/// punctuation other than `-` and `_` dropped.
fn anchor_of(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// Every relative link of the README and the pages under docs/ names a
/// file that exists and, with `#anchor`, a heading of that file.
#[test]
fn every_link_between_the_pages_leads_somewhere() {
    let top = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut pages = vec![top.join("README.md")];
    for entry in std::fs::read_dir(top.join("docs")).expect("docs/") {
        let path = entry.expect("entry").path();
        if path.extension().is_some_and(|e| e == "md") {
            pages.push(path);
        }
    }
    let mut checked = 0;
    for page in &pages {
        let text = std::fs::read_to_string(page).unwrap();
        let mut rest = text.as_str();
        while let Some(at) = rest.find("](") {
            rest = &rest[at + 2..];
            let Some(end) = rest.find(')') else { break };
            let target = &rest[..end];
            if target.starts_with("http") || target.contains(' ') {
                continue;
            }
            let (file, anchor) = target.split_once('#').unwrap_or((target, ""));
            let linked = if file.is_empty() {
                page.clone()
            } else {
                page.parent().unwrap().join(file)
            };
            assert!(
                linked.exists(),
                "{}: link to {target}: no such file",
                page.display()
            );
            if !anchor.is_empty() {
                let linked_text = std::fs::read_to_string(&linked).unwrap();
                let anchors: Vec<String> = linked_text
                    .lines()
                    .filter_map(|l| l.strip_prefix('#'))
                    .map(|l| anchor_of(l.trim_start_matches('#')))
                    .collect();
                assert!(
                    anchors.iter().any(|a| a == anchor),
                    "{}: link to {target}: no such heading in {}",
                    page.display(),
                    linked.display()
                );
            }
            checked += 1;
        }
    }
    assert!(checked >= 20, "only {checked} links checked");
}
