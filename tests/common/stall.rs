//! Disks that stop answering, for real: a shim preloaded into the nodes (`LD_PRELOAD`, built here
//! with the C compiler cargo links with) holds every `fdatasync` and `fsync` the node calls while
//! its node's flag file exists, as a network volume's I/O pause or a failing disk holds them. The
//! node's own threads block in the call; nothing in the gateway knows it is a test.

use std::path::{Path, PathBuf};
use std::process::Command;

const SHIM: &str = r#"
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static void hold_while_flagged(void) {
    const char *flag = getenv("GATEWAY_IT_STALL_FLUSHES_WHILE");
    struct timespec nap = {0, 5 * 1000 * 1000};
    while (flag && access(flag, F_OK) == 0) nanosleep(&nap, 0);
}

int fdatasync(int fd) {
    static int (*real)(int);
    if (!real) real = (int (*)(int))dlsym(RTLD_NEXT, "fdatasync");
    hold_while_flagged();
    return real(fd);
}

int fsync(int fd) {
    static int (*real)(int);
    if (!real) real = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
    hold_while_flagged();
    return real(fd);
}
"#;

/// The environment variable naming a node's flag file.
pub const FLAG_ENV: &str = "GATEWAY_IT_STALL_FLUSHES_WHILE";

/// Builds the shim into `dir` and returns its path; panics naming the compiler when it cannot.
pub fn build_shim(dir: &Path) -> PathBuf {
    let src = dir.join("stall.c");
    let lib = dir.join("libstall.so");
    std::fs::write(&src, SHIM).unwrap();
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let out = Command::new(&cc)
        .args(["-shared", "-fPIC", "-O2", "-o"])
        .arg(&lib)
        .arg(&src)
        .arg("-ldl")
        .output()
        .unwrap_or_else(|e| panic!("building the flush-stall shim needs a C compiler ({cc}): {e}"));
    assert!(out.status.success(), "{cc} could not build the shim: {}", String::from_utf8_lossy(&out.stderr));
    lib
}
