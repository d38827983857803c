//! The source and PTX side of [`super`]: std only, so that cubellm's test suite can include this
//! file (`crates/runtime/tests/pdl_prologue.rs`) and check it without a GPU.

use std::ffi::c_char;

use super::entry::entry_signature;

/// The first statement of every entry point. It holds the kernel until the grid before it on
/// the stream has completed and its writes are visible (at once when the kernel was launched
/// without PDL). There is no early `griddepcontrol.launch_dependents`: the next grid launches
/// when this one's blocks have all exited, so a grid's blocks never wait on an SM beside the
/// blocks of the one before it (see `super` for what that cost).
pub const PROLOGUE: &str = "\nasm volatile(\"griddepcontrol.wait;\" ::: \"memory\");\n";

/// `source` with [`PROLOGUE`] as the first statement of the entry point `entry`, or `None` when
/// the entry point's definition is not found (the kernel is then compiled and launched as is).
///
/// A kernel that already waits itself (its source holds `griddepcontrol.wait`) is returned
/// unchanged: it reads only memory that no kernel writes (a decode product's weights) before its
/// own wait, so that those loads overlap the end of the kernel before it.
pub fn with_prologue(source: &str, entry: &str) -> Option<String> {
    if source.contains("griddepcontrol.wait") {
        return Some(source.to_owned());
    }
    let (_, body) = entry_signature(source, entry)?;
    let mut out = String::with_capacity(source.len() + PROLOGUE.len());
    out.push_str(&source[..=body]);
    out.push_str(PROLOGUE);
    out.push_str(&source[body + 1..]);
    Some(out)
}

/// Whether a module's PTX holds the wait of [`PROLOGUE`].
pub fn waits_first(ptx: &[c_char]) -> bool {
    const WAIT: &[u8] = b"griddepcontrol.wait";
    ptx.windows(WAIT.len())
        .any(|w| w.iter().zip(WAIT).all(|(&c, &b)| c as u8 == b))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SRC: &str = "typedef int i32;\n__device__ void helper(int* p) {\n*p = 1;\n}\n\
                       extern \"C\" __global__ void __launch_bounds__(256)  add_kernel_f16(const \
                       half* __restrict__ a, half* out) {\nint x = 0;\n}\n";

    #[test]
    fn prologue_opens_the_entry_body() {
        let out = with_prologue(SRC, "add_kernel_f16").unwrap();
        let body = out.split("add_kernel_f16(").nth(1).unwrap();
        let body = &body[body.find('{').unwrap() + 1..];
        assert!(body.starts_with(PROLOGUE), "{out}");
        assert_eq!(out.replace(PROLOGUE, ""), SRC);
    }

    #[test]
    fn a_kernel_that_waits_itself_is_left_alone() {
        let own = SRC.replace(
            "int x = 0;",
            "int x = 0;\nasm volatile(\"griddepcontrol.wait;\" ::: \"memory\");",
        );
        assert_eq!(
            with_prologue(&own, "add_kernel_f16").as_deref(),
            Some(own.as_str())
        );
    }

    #[test]
    fn unknown_entry_is_left_alone() {
        assert_eq!(with_prologue(SRC, "add_kernel"), None);
        assert_eq!(with_prologue(SRC, "helper"), None);
    }

    #[test]
    fn ptx_check() {
        let ptx: Vec<c_char> = b"\tgriddepcontrol.wait;\n\0"
            .iter()
            .map(|&b| b as c_char)
            .collect();
        assert!(waits_first(&ptx));
        let plain: Vec<c_char> = b"\tld.global.v4.u32\n\0"
            .iter()
            .map(|&b| b as c_char)
            .collect();
        assert!(!waits_first(&plain));
    }
}
