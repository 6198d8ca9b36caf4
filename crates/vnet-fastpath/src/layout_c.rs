//! How the interface of `src/layout_def.rs` is spelled in C: the pieces that
//! `layout::c_header` (the C side of the one expansion in `src/layout.rs`) writes the
//! programs' header `fastpath_layout.h` with. A file of its own because build.rs compiles it
//! too (with `src/layout.rs`, through `#[path]`): the header is written at build time, before
//! clang compiles the programs, from the same expansion the Rust types come from.
//!
//! Pure: strings in, strings out.

#![forbid(unsafe_code)]

/// Doc lines as C comments, each indented by `indent`.
pub(crate) fn c_doc(h: &mut String, indent: &str, lines: &[&str]) {
    for l in lines {
        h.push_str(&format!("{indent}//{}\n", l.trim_end()));
    }
}

/// `#define NAME VALUE` of a constant of Rust type `ty` (unsigned types get a `u`).
pub(crate) fn c_define(name: &str, ty: &str, value: u64) -> String {
    let suffix = if ty.starts_with('u') { "u" } else { "" };
    if value > 0xff {
        format!("#define {name} {value:#x}{suffix}\n")
    } else {
        format!("#define {name} {value}{suffix}\n")
    }
}

/// The C declaration of a field of Rust type `ty` (as `stringify!` writes it). A type with no
/// C twin here is a mistake in `src/layout_def.rs`: it stops the build with a message.
pub(crate) fn c_field(name: &str, ty: &str) -> String {
    let scalar = |t: &str| -> String {
        match t {
            "u8" | "u16" | "u32" | "u64" => format!("__{t}"),
            "i8" | "i16" | "i32" | "i64" => format!("__s{}", &t[1..]),
            "BpfSpinLock" => "struct bpf_spin_lock".to_string(),
            other => panic!(
                "src/layout_def.rs: field {name} has type {other}, which has no C twin here \
                 (u8..u64, i8..i64, [T; N], BpfSpinLock)"
            ),
        }
    };
    match ty.strip_prefix('[').and_then(|t| t.strip_suffix(']')) {
        Some(arr) => {
            let (elem, n) = arr
                .split_once(';')
                .unwrap_or_else(|| panic!("src/layout_def.rs: field {name}: array type {ty}"));
            format!("{} {name}[{}]", scalar(elem.trim()), n.trim())
        }
        None => format!("{} {name}", scalar(ty)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_and_constants_in_c() {
        assert_eq!(c_field("vni", "u32"), "__u32 vni");
        assert_eq!(c_field("cap", "i64"), "__s64 cap");
        assert_eq!(c_field("mac", "[u8; 6]"), "__u8 mac[6]");
        assert_eq!(c_field("lock", "BpfSpinLock"), "struct bpf_spin_lock lock");
        assert_eq!(c_define("ACT_SHIFT", "u32", 24), "#define ACT_SHIFT 24u\n");
        assert_eq!(
            c_define("ACT_SLOT_MASK", "u32", 0xff_ffff),
            "#define ACT_SLOT_MASK 0xffffffu\n"
        );
        let mut h = String::new();
        c_doc(&mut h, "\t", &[" one", " two  "]);
        assert_eq!(h, "\t// one\n\t// two\n");
    }

    #[test]
    #[should_panic(expected = "no C twin")]
    fn a_field_type_without_a_c_twin_is_refused() {
        c_field("x", "usize");
    }
}
