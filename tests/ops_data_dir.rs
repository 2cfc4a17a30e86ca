//! `gateway serve` refuses a data directory it cannot use, naming the path that is wrong (not only
//! the system's `File exists` or `Is a directory`), and leaves what it found as it was.

mod common;

use std::path::Path;

use common::run_cli;

/// `gateway serve --data-dir <data>` on ephemeral loopback ports: its exit code and stderr.
fn serve(data: &Path) -> (Option<i32>, String) {
    let data = data.to_str().expect("a UTF-8 temp path");
    let out = run_cli(&["serve", "--listen", "127.0.0.1:0", "--cluster-listen", "127.0.0.1:0", "--data-dir", data]);
    (out.code, out.stderr)
}

#[test]
fn serve_refuses_a_data_dir_it_cannot_use_and_names_the_path() {
    let dir = tempfile::tempdir().unwrap();

    // The data dir is a file: a configuration to fix (exit 78).
    let file = dir.path().join("data");
    std::fs::write(&file, b"a file").unwrap();
    let (code, stderr) = serve(&file);
    assert_eq!(code, Some(78), "{stderr}");
    assert!(stderr.contains(&format!("data dir {}: not a directory", file.display())), "{stderr}");
    assert_eq!(std::fs::read(&file).unwrap(), b"a file");

    // A directory where the state file goes, and a file where the log's directory goes: the
    // store fails to open (exit 1) and says which of its paths it could not open.
    let data = dir.path().join("node");
    std::fs::create_dir_all(data.join("state.redb")).unwrap();
    let (code, stderr) = serve(&data);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains(&format!("{}: ", data.join("state.redb").display())), "{stderr}");
    assert!(data.join("state.redb").is_dir());

    let data = dir.path().join("node2");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(data.join("log"), b"not the log").unwrap();
    let (code, stderr) = serve(&data);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains(&format!("{}: ", data.join("log").display())), "{stderr}");
    assert_eq!(std::fs::read(data.join("log")).unwrap(), b"not the log");
}
