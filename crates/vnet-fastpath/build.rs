//! With the `kernel` feature (the kernel fast path), builds the BPF side from its sources:
//!
//! 1. OUT_DIR/fastpath_layout.h, src/layout_def.rs in C (the maps' keys and values, the
//!    settings, flags and counter indexes): `layout::c_header`, from the one expansion in
//!    src/layout.rs that also makes the Rust types (this script compiles that file, and
//!    src/layout_c.rs, as modules of its own);
//! 2. OUT_DIR/fastpath.bpf.o, bpf/fastpath.bpf.c compiled by clang (needs clang and the BPF
//!    headers of libbpf-dev: without them the build stops with a message that says how to get
//!    them);
//! 3. OUT_DIR/fastpath.skel.rs, libbpf-cargo's skeleton of that object (its maps, programs
//!    and `.rodata` as Rust fields, the object embedded), which src/maps.rs includes.
//!
//! Without the feature it does nothing: the pure part (compile, layout) needs no clang.

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

// The library's own files: the script needs only `layout::c_header` of them.
#[allow(dead_code)]
#[path = "src/layout.rs"]
mod layout;
#[path = "src/layout_c.rs"]
mod layout_c;

fn main() {
    println!("cargo:rerun-if-changed=bpf/fastpath.bpf.c");
    println!("cargo:rerun-if-changed=src/layout_def.rs");
    println!("cargo:rerun-if-changed=src/layout.rs");
    println!("cargo:rerun-if-changed=src/layout_c.rs");
    println!("cargo:rerun-if-env-changed=CLANG");
    if env::var_os("CARGO_FEATURE_KERNEL").is_none() {
        return;
    }
    let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let header = out.join("fastpath_layout.h");
    if let Err(e) = std::fs::write(&header, layout::c_header()) {
        fail(&format!("cannot write {}: {e}", header.display()));
    }
    let obj = out.join("fastpath.bpf.o");
    compile(&out, &obj);
    skeleton(&obj, &out.join("fastpath.skel.rs"));
}

fn compile(out: &Path, obj: &Path) {
    let clang = env::var("CLANG").unwrap_or_else(|_| "clang".to_string());
    let version = Command::new(&clang).arg("--version").output();
    if !matches!(&version, Ok(o) if o.status.success()) {
        fail(&format!(
            "`{clang}` (clang) was not found: it compiles vnet's BPF programs. \
             Run `bash scripts/setup.sh` as root (it installs clang, llvm, libbpf-dev, \
             libelf-dev, zlib1g-dev and pkg-config), or set CLANG to a clang binary, or build \
             without the kernel fast path (vnetd: --no-default-features)."
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
        .arg(format!("-I{}", out.display()))
        .arg(format!("-I/usr/include/{multiarch}"))
        .args(["-c", "bpf/fastpath.bpf.c", "-o"])
        .arg(obj)
        .status();
    match status {
        Ok(s) if s.success() => {}
        Ok(s) => fail(&format!("clang failed to compile bpf/fastpath.bpf.c ({s})")),
        Err(e) => fail(&format!("could not run `{clang}`: {e}")),
    }
}

#[cfg(feature = "kernel")]
fn skeleton(obj: &Path, out: &Path) {
    let res = libbpf_cargo::SkeletonBuilder::new()
        .obj(obj)
        .reference_obj(true)
        .generate(out);
    if let Err(e) = res {
        fail(&format!(
            "generating the skeleton of {}: {e:#}",
            obj.display()
        ));
    }
}

#[cfg(not(feature = "kernel"))]
fn skeleton(_obj: &Path, _out: &Path) {}

fn fail(msg: &str) -> ! {
    eprintln!("error: vnet-fastpath: {msg}");
    std::process::exit(1);
}
