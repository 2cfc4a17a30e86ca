//! Tidy: the architecture invariants of `src/lib.rs`, checked on the source text (as
//! rust-analyzer's tidy test does). Each module may name only the crate modules its row allows,
//! the domain core and the pure modules name no runtime crate and read no clock, the edges never
//! build a raw command or match the crate-wide reply, and no file grows past 600 lines.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Crates that do I/O, spawn, or speak a wire or storage format.
const RUNTIME: &[&str] =
    &["tokio", "tokio_util", "hyper", "hyper_util", "http_body_util", "openraft", "redb", "fastwebsockets"];
/// What else a pure module must not touch: randomness, logging, the OS.
const IMPURE: &[&str] = &["rand", "tracing", "std::fs", "std::net", "std::thread", "std::env", "std::process"];
/// Server modules the tools, the client and the edges must keep away from.
const SERVER: &[&str] = &["node", "ws", "api", "cluster", "raft", "store"];

/// Which crate modules each module may name (`crate::<module>`). `None`: anything.
fn allowed(module: &str) -> Option<&'static [&'static str]> {
    Some(match module {
        // Pure leaves and the domain core.
        "machine" | "ring" | "codec" | "config" | "protocol" | "clock" | "secrets" | "token" | "http" | "metrics" => {
            &[]
        }
        // TLS files and configurations; the accept loop serves them.
        "tls" => &["config", "metrics"],
        "server" => &["tls", "metrics"],
        "view" => &["machine", "ring"],
        "wire" => &["config", "machine"],
        "answer" => &["cluster", "machine"],
        // The redb schema knows the domain's values, not openraft.
        "store" => &["machine", "codec"],
        // openraft adapters: under the port, never above it.
        "raft" => &["store", "machine", "view", "codec", "http", "metrics", "clock"],
        "cluster" => &["raft", "store", "machine", "view", "codec", "config", "http", "metrics", "clock", "wire"],
        // The edges see the cluster through the port only.
        "ws" => {
            &["cluster", "machine", "view", "protocol", "answer", "token", "metrics", "clock", "server", "upstream"]
        }
        // Device -> backend delivery: its config section, its metrics, the frames it answers with.
        "upstream" => &["config", "metrics", "protocol"],
        "api" => &[
            "cluster", "machine", "view", "answer", "token", "metrics", "http", "config", "wire", "ws", "server",
            "protocol", "secrets",
        ],
        "client" => &["protocol"],
        "tools" => &["client", "protocol", "http", "wire", "machine", "token", "secrets", "clock", "tools", "tls"],
        "cli" => &["config", "tools"],
        // The node's duties, failure detector and lifecycle decide through the port too.
        "node/duties" | "node/detector" | "node/lifecycle" => {
            &["cluster", "machine", "view", "ws", "config", "metrics", "clock", "protocol", "http", "tools"]
        }
        "node" | "lib" | "main" => return None,
        other => panic!("src/{other}: a module tidy.rs does not know: give it a row in `allowed`"),
    })
}

/// Modules that must not name a runtime crate, do I/O, draw randomness or read a clock.
const PURE: &[&str] = &["machine", "ring", "view", "codec", "protocol"];

struct File {
    path: PathBuf,
    /// The top-level module (`ws`, `machine`, …), or `node/duties`, `node/detector` and `node/lifecycle`.
    module: String,
    /// The source without comment lines.
    code: Vec<(usize, String)>,
    lines: usize,
}

impl File {
    /// The code as one text (line breaks kept), and the line of a byte offset in it.
    fn text(&self) -> (String, Vec<usize>) {
        let mut text = String::new();
        let mut line_of = Vec::new();
        for (n, line) in &self.code {
            text.push_str(line);
            text.push('\n');
            line_of.resize(text.len(), *n);
        }
        (text, line_of)
    }
}

fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

fn sources() -> Vec<File> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut paths = Vec::new();
    files(&src, &mut paths);
    paths.sort();
    paths
        .into_iter()
        .map(|path| {
            let rel = path.strip_prefix(&src).unwrap();
            let first = rel.components().next().unwrap().as_os_str().to_string_lossy().into_owned();
            let mut module = first.trim_end_matches(".rs").to_string();
            if ["node/duties.rs", "node/detector.rs", "node/lifecycle.rs"].iter().any(|p| rel == Path::new(p)) {
                module = rel.with_extension("").to_string_lossy().into_owned();
            }
            let text = std::fs::read_to_string(&path).unwrap();
            let code = text
                .lines()
                .enumerate()
                .filter(|(_, l)| !l.trim_start().starts_with("//"))
                .map(|(i, l)| (i + 1, l.to_string()))
                .collect();
            File { path: rel.to_path_buf(), module, code, lines: text.lines().count() }
        })
        .collect()
}

/// Every `<prefix><ident>` in `line`, where the prefix starts at a word boundary.
fn after<'a>(line: &'a str, prefix: &str) -> Vec<&'a str> {
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(at) = line[from..].find(prefix).map(|i| i + from) {
        let boundary = line[..at].chars().next_back().is_none_or(|c| !(c.is_alphanumeric() || c == '_'));
        let rest = &line[at + prefix.len()..];
        let end = rest.find(|c: char| !(c.is_alphanumeric() || c == '_')).unwrap_or(rest.len());
        if boundary && end > 0 {
            out.push(&rest[..end]);
        }
        from = at + prefix.len();
    }
    out
}

/// The crate modules `text` names, with the byte offset of each: `crate::a::…` and every first
/// segment of a group `crate::{a::…, b, c::{…}}` (over line breaks too).
fn crate_modules(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for (at, _) in text.match_indices("crate::") {
        let boundary = text[..at].chars().next_back().is_none_or(|c| !(c.is_alphanumeric() || c == '_'));
        if !boundary {
            continue;
        }
        let rest = &text[at + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            // Top-level items of the group: split at commas outside nested braces.
            let (mut depth, mut start) = (0usize, 0usize);
            for (i, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => {
                        out.extend(first_segment(&group[start..i]).map(|m| (at, m)));
                        break;
                    }
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        out.extend(first_segment(&group[start..i]).map(|m| (at, m)));
                        start = i + 1;
                    }
                    _ => {}
                }
            }
        } else {
            out.extend(first_segment(rest).map(|m| (at, m)));
        }
    }
    out
}

fn first_segment(path: &str) -> Option<String> {
    let path = path.trim_start();
    let end = path.find(|c: char| !(c.is_alphanumeric() || c == '_')).unwrap_or(path.len());
    (end > 0 && path[..end] != *"self").then(|| path[..end].to_string())
}

/// Whether `line` names the path `word::` at a word boundary (e.g. `tokio::`, `Command::`).
fn names(line: &str, word: &str) -> bool {
    !after(line, &format!("{word}::")).is_empty() || line.contains(&format!("use {word};"))
}

/// Whether `word` occurs in `line` with no identifier character on either side.
fn whole_word(line: &str, word: &str) -> bool {
    line.match_indices(word).any(|(at, _)| {
        let ident = |c: char| c.is_alphanumeric() || c == '_';
        line[..at].chars().next_back().is_none_or(|c| !ident(c))
            && line[at + word.len()..].chars().next().is_none_or(|c| !ident(c))
    })
}

#[test]
fn modules_name_only_what_their_row_allows() {
    let mut broken = BTreeMap::<String, BTreeSet<String>>::new();
    for f in sources() {
        let Some(ok) = allowed(&f.module) else { continue };
        let own = f.module.split('/').next().unwrap();
        let (text, line_of) = f.text();
        for (at, used) in crate_modules(&text) {
            if used != own && !ok.contains(&used.as_str()) {
                let place = format!("src/{} ({})", f.path.display(), f.module);
                broken.entry(place).or_default().insert(format!("{}: crate::{used}", line_of[at]));
            }
        }
    }
    assert!(broken.is_empty(), "modules naming what lib.rs's invariants forbid: {broken:#?}");
}

#[test]
fn the_domain_core_and_pure_modules_use_no_runtime_crate_and_no_clock() {
    let mut broken = Vec::new();
    for f in sources().iter().filter(|f| PURE.contains(&f.module.as_str())) {
        for (n, line) in &f.code {
            let runtime = RUNTIME.iter().chain(IMPURE).filter(|c| names(line, c));
            let clock = ["SystemTime", "Instant"].into_iter().filter(|c| line.contains(c));
            for what in runtime.copied().chain(clock) {
                broken.push(format!("src/{}:{n}: {what}", f.path.display()));
            }
        }
    }
    assert!(broken.is_empty(), "pure modules touching a runtime crate or a clock: {broken:#?}");
}

#[test]
fn the_edges_never_build_a_raw_command_or_match_the_crate_wide_reply() {
    let edge = |f: &File| {
        matches!(f.module.as_str(), "ws" | "api" | "answer")
            || f.path.ends_with("node/duties.rs")
            || f.path.ends_with("node/detector.rs")
            || f.path.ends_with("node/lifecycle.rs")
    };
    let mut broken = Vec::new();
    for f in sources().iter().filter(|f| edge(f)) {
        for (n, line) in &f.code {
            let raw = ["Command", "Reply", "openraft", "redb"].into_iter().filter(|w| names(line, w));
            let behind_the_port = ["Proposer", "proposer", "StateDb"].into_iter().filter(|w| whole_word(line, w));
            for what in raw.chain(behind_the_port) {
                broken.push(format!("src/{}:{n}: {what}", f.path.display()));
            }
        }
    }
    assert!(broken.is_empty(), "the edges reach past the cluster port: {broken:#?}");
}

#[test]
fn client_and_tools_import_no_server_module() {
    let mut broken = Vec::new();
    for f in sources().iter().filter(|f| f.module == "client" || f.module == "tools") {
        for (n, line) in &f.code {
            for used in after(line, "crate::").into_iter().filter(|m| SERVER.contains(m)) {
                broken.push(format!("src/{}:{n}: crate::{used}", f.path.display()));
            }
        }
    }
    assert!(broken.is_empty(), "the client or a tool imports the server: {broken:#?}");
}

/// Every task a node spawns is tracked (its `TaskTracker`) so shutdown can wait for it; the one
/// bare spawn is a session's reader, owned by the session, which awaits or aborts it.
#[test]
fn server_tasks_are_spawned_on_a_tracker() {
    let server = [
        "node",
        "ws",
        "api",
        "cluster",
        "raft",
        "store",
        "server",
        "node/duties",
        "node/detector",
        "node/lifecycle",
        "upstream",
    ];
    let mut broken = Vec::new();
    for f in sources().iter().filter(|f| server.contains(&f.module.as_str())) {
        if f.path.ends_with("ws/session.rs") {
            continue;
        }
        for (n, line) in &f.code {
            if line.contains("tokio::spawn(") || line.contains("thread::spawn(") {
                broken.push(format!("src/{}:{n}", f.path.display()));
            }
        }
    }
    // Test modules may spawn freely: only count lines before a file's `mod tests`, and none in a
    // test module of its own file (`tests.rs`, `*_tests.rs`).
    broken.retain(|place| {
        let (path, n) = place.rsplit_once(':').unwrap();
        if path.ends_with("tests.rs") {
            return false;
        }
        let text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(path)).unwrap();
        let tests_at = text.lines().position(|l| l.starts_with("mod tests") || l.starts_with("#[cfg(test)]"));
        tests_at.is_none_or(|t| n.parse::<usize>().unwrap() <= t)
    });
    assert!(broken.is_empty(), "untracked spawns (use the node's TaskTracker): {broken:?}");
}

#[test]
fn no_file_over_600_lines() {
    let long: Vec<String> = sources()
        .iter()
        .filter(|f| f.lines > 600)
        .map(|f| format!("src/{} ({} lines)", f.path.display(), f.lines))
        .collect();
    assert!(long.is_empty(), "split these by concept: {long:?}");
}

#[test]
fn the_checks_see_what_they_look_for() {
    // The scanner itself: word boundaries, and a path's first segment.
    assert_eq!(after("use crate::store::state::StateDb;", "crate::"), ["store"]);
    assert_eq!(after("x = crate::machine::Claim { .. }; y: mycrate::ws", "crate::"), ["machine"]);
    assert!(names("let c = Command::Claim(claim);", "Command"));
    assert!(!names("Ok(ClaimReply::Stale { .. })", "Reply"));
    assert!(names("use tokio::sync::watch;", "tokio"));
    assert!(!names("use tokio_util::task::TaskTracker;", "tokio"));
    assert!(whole_word("proposer: Proposer,", "Proposer") && !whole_word("RaftMetrics", "Raft"));
    let grouped = "use crate::{\n    store::state::StateDb,\n    machine::{Claim, Route}, self,\n};";
    let found: Vec<String> = crate_modules(grouped).into_iter().map(|(_, m)| m).collect();
    assert_eq!(found, ["store", "machine"]);
    // Every module of the crate has a row (this panics on one that does not).
    for f in sources() {
        allowed(&f.module);
    }
}
