//! Compiles the BPF programs (bpf/fastpath.bpf.c) with clang into OUT_DIR/fastpath.bpf.o,
//! which src/loader.rs embeds. Needs clang and the BPF headers of libbpf-dev: without them the
//! build stops with a message that says how to get them.

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=bpf/fastpath.bpf.c");
    println!("cargo:rerun-if-changed=bpf/fastpath.h");
    println!("cargo:rerun-if-env-changed=CLANG");
    let clang = env::var("CLANG").unwrap_or_else(|_| "clang".to_string());
    let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let obj = out.join("fastpath.bpf.o");

    let version = Command::new(&clang).arg("--version").output();
    if !matches!(&version, Ok(o) if o.status.success()) {
        fail(&format!(
            "`{clang}` (clang) was not found: it compiles vnet's BPF programs. \
             Run `bash scripts/setup.sh` as root (it installs clang, llvm, libbpf-dev, \
             libelf-dev, zlib1g-dev and pkg-config), or set CLANG to a clang binary."
        ));
    }
    if !Path::new("/usr/include/bpf/bpf_helpers.h").exists() {
        fail(
            "/usr/include/bpf/bpf_helpers.h is missing (Debian package libbpf-dev): \
             run `bash scripts/setup.sh` as root.",
        );
    }
    // The kernel UAPI headers include <asm/types.h>, which lives in the multiarch directory.
    let arch = env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default();
    let multiarch = match arch.as_str() {
        "x86_64" => "x86_64-linux-gnu",
        "aarch64" => "aarch64-linux-gnu",
        "riscv64" => "riscv64-linux-gnu",
        other => other,
    };
    let status = Command::new(&clang)
        .args(["-O2", "-g", "-target", "bpf", "-Wall", "-Werror"])
        .arg("-Ibpf")
        .arg(format!("-I/usr/include/{multiarch}"))
        .args(["-c", "bpf/fastpath.bpf.c", "-o"])
        .arg(&obj)
        .status();
    match status {
        Ok(s) if s.success() => {}
        Ok(s) => fail(&format!("clang failed to compile bpf/fastpath.bpf.c ({s})")),
        Err(e) => fail(&format!("could not run `{clang}`: {e}")),
    }
}

fn fail(msg: &str) -> ! {
    eprintln!("error: vnet-fastpath: {msg}");
    std::process::exit(1);
}
