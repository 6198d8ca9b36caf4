//! With the `kernel` feature (the kernel fast path), builds the BPF side from its sources:
//!
//! 1. OUT_DIR/fastpath_layout.h, the C expansion of src/layout_def.rs (the maps' keys and
//!    values, the settings, flags and counter indexes; src/layout.rs is the Rust expansion);
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

fn main() {
    println!("cargo:rerun-if-changed=bpf/fastpath.bpf.c");
    println!("cargo:rerun-if-changed=src/layout_def.rs");
    println!("cargo:rerun-if-env-changed=CLANG");
    if env::var_os("CARGO_FEATURE_KERNEL").is_none() {
        return;
    }
    let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let header = out.join("fastpath_layout.h");
    if let Err(e) = std::fs::write(&header, c_header()) {
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

/// Doc lines as C comments.
fn c_doc(h: &mut String, indent: &str, lines: &[&str]) {
    for l in lines {
        h.push_str(&format!("{indent}//{}\n", l.trim_end()));
    }
}

/// `#define NAME VALUE` of a constant of Rust type `ty`.
fn c_define(name: &str, ty: &str, value: u64) -> String {
    let suffix = if ty.starts_with('u') { "u" } else { "" };
    if value > 0xff {
        format!("#define {name} {value:#x}{suffix}\n")
    } else {
        format!("#define {name} {value}{suffix}\n")
    }
}

/// The C declaration of a field of Rust type `ty` (as `stringify!` writes it).
fn c_field(name: &str, ty: &str) -> String {
    let scalar = |t: &str| -> String {
        match t {
            "u8" | "u16" | "u32" | "u64" => format!("__{t}"),
            "i8" | "i16" | "i32" | "i64" => format!("__s{}", &t[1..]),
            "BpfSpinLock" => "struct bpf_spin_lock".to_string(),
            other => fail(&format!(
                "src/layout_def.rs: field {name} has type {other}, which has no C twin here \
                 (u8..u64, i8..i64, [T; N], BpfSpinLock)"
            )),
        }
    };
    match ty.strip_prefix('[').and_then(|t| t.strip_suffix(']')) {
        Some(arr) => {
            let (elem, n) = arr
                .split_once(';')
                .unwrap_or_else(|| fail(&format!("field {name}: array type {ty}")));
            format!("{} {name}[{}]", scalar(elem.trim()), n.trim())
        }
        None => format!("{} {name}", scalar(ty)),
    }
}

/// The C expansion of src/layout_def.rs (src/layout.rs has the Rust one).
macro_rules! bpf_layout {
    (
        consts { $( $(#[doc = $cdoc:literal])* $cname:ident : $cty:ty = $cval:expr ; )* }
        enums { $(
            $(#[doc = $edoc:literal])*
            $ename:ident as $emod:ident prefix $epre:ident {
                $( $(#[doc = $vdoc:literal])* $vname:ident = $vval:literal ),* $(,)?
            }
        )* }
        structs { $(
            $(#[doc = $sdoc:literal])*
            $sname:ident as $rname:ident {
                $( $(#[doc = $fdoc:literal])* $fname:ident : $fty:ty ),* $(,)?
            }
        )* }
    ) => {
        fn c_header() -> String {
            let mut h = String::from(
                "/* Generated by build.rs from src/layout_def.rs (the one definition of the\n \
                 * interface; src/layout.rs is its Rust side): do not edit. */\n\
                 #ifndef VNET_FASTPATH_LAYOUT_H\n#define VNET_FASTPATH_LAYOUT_H\n\n",
            );
            $(
                c_doc(&mut h, "", &[$($cdoc),*]);
                h.push_str(&c_define(stringify!($cname), stringify!($cty), ($cval) as u64));
            )*
            h.push('\n');
            $(
                c_doc(&mut h, "", &[$($edoc),*]);
                h.push_str(&format!("enum {} {{\n", stringify!($ename)));
                $(
                    c_doc(&mut h, "\t", &[$($vdoc),*]);
                    h.push_str(&format!(
                        "\t{}{} = {},\n",
                        stringify!($epre),
                        stringify!($vname),
                        $vval
                    ));
                )*
                h.push_str("};\n\n");
            )*
            $(
                c_doc(&mut h, "", &[$($sdoc),*]);
                h.push_str(&format!("struct {} {{\n", stringify!($sname)));
                $(
                    c_doc(&mut h, "\t", &[$($fdoc),*]);
                    h.push_str(&format!("\t{};\n", c_field(stringify!($fname), stringify!($fty))));
                )*
                h.push_str("};\n\n");
            )*
            h.push_str("#endif\n");
            h
        }
    };
}

include!("src/layout_def.rs");
