//! The source side of a kernel's occupancy request: std only, so that cubellm's test suite can
//! include this file (`crates/runtime/tests/launch_bounds.rs`) and check it without a GPU.
//!
//! A kernel asks for `n` of its cubes to be resident on one SM at once by holding the PTX comment
//! [`MARKER`]` n` (an inline-assembly comment, so it changes nothing in the kernel): its entry
//! point's `__launch_bounds__(units)` becomes `__launch_bounds__(units, n)`, and ptxas keeps the
//! registers per unit within what `n` cubes leave. A launch that sizes its grid to exactly one
//! wave of such cubes (a persistent kernel walking its work) relies on it: a cube that did not
//! fit would wait for a whole cube's work.

use super::entry::entry_signature;

/// The comment a kernel's source holds, followed by the cube count (`// cubellm.min_cubes_per_sm 3`).
pub const MARKER: &str = "cubellm.min_cubes_per_sm ";

/// `source` with the entry point `entry`'s launch bounds asking for the cubes per SM that the
/// source's [`MARKER`] names, or `None` when the source has no marker, the count is not a
/// positive number, or the entry's `__launch_bounds__(n)` is not found.
pub fn with_min_cubes(source: &str, entry: &str) -> Option<String> {
    let at = source.find(MARKER)? + MARKER.len();
    let digits: String = source[at..]
        .chars()
        .take_while(|c| c.is_ascii_digit())
        .collect();
    let cubes: u32 = digits.parse().ok().filter(|&n| n > 0)?;
    let (sig, body) = entry_signature(source, entry)?;
    let bounds = "__launch_bounds__(";
    let open = sig + source[sig..body].find(bounds)? + bounds.len();
    let close = open + source[open..body].find(')')?;
    let units = source[open..close].trim();
    if units.is_empty() || !units.chars().all(|c| c.is_ascii_digit()) {
        return None;
    }
    let mut out = String::with_capacity(source.len() + 8);
    out.push_str(&source[..close]);
    out.push_str(&format!(", {cubes}"));
    out.push_str(&source[close..]);
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SRC: &str = "typedef int i32;\n__device__ void helper(int* p) {\n*p = 1;\n}\n\
                       extern \"C\" __global__ void __launch_bounds__(256)  gemv_kernel_f16(const \
                       half* __restrict__ a, half* out) {\nint x = 0;\n\
                       asm volatile(\"// cubellm.min_cubes_per_sm 3\");\n}\n";

    #[test]
    fn the_marker_sets_the_entry_bounds() {
        let out = with_min_cubes(SRC, "gemv_kernel_f16").unwrap();
        assert!(
            out.contains("__launch_bounds__(256, 3)  gemv_kernel_f16("),
            "{out}"
        );
        assert_eq!(out.replace("(256, 3)", "(256)"), SRC);
    }

    #[test]
    fn without_a_marker_or_entry_nothing_changes() {
        let plain = SRC.replace("cubellm.min_cubes_per_sm 3", "nothing");
        assert_eq!(with_min_cubes(&plain, "gemv_kernel_f16"), None);
        assert_eq!(with_min_cubes(SRC, "gemv_kernel"), None);
        assert_eq!(with_min_cubes(SRC, "helper"), None);
        let zero = SRC.replace("per_sm 3", "per_sm 0");
        assert_eq!(with_min_cubes(&zero, "gemv_kernel_f16"), None);
    }
}
