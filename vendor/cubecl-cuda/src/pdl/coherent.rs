//! Coherent loads of what the kernel before writes, in kernels that place their own
//! `griddepcontrol.wait`: std only, so that cubellm's test suite can include this file
//! (`crates/runtime/tests/coherent_params.rs`) and check it without a GPU.
//!
//! CubeCL declares every buffer a kernel only reads `const* const __restrict__`, and NVRTC then
//! loads it with `ld.global.nc`: memory that stays unchanged for the kernel's whole lifetime.
//! ptxas may move such a load anywhere, also above `griddepcontrol.wait`. Under programmatic
//! dependent launch that promise does not hold for the output of the kernel before, which may
//! still be running when this one starts: in ptxas 12.9's SASS of the f32 decode GEMV with its
//! weights pinned below the wait, the first vector of x was loaded above the wait, and the
//! model's decode steps read a stale activation. A coherent load (`ld.global`, from a pointer
//! without `__restrict__`) is never moved above the wait.
//!
//! A kernel that waits itself names the parameters it reads before its wait (weights and
//! other memory no kernel still running writes) in the PTX comment [`MARKER`]
//! (`// cubellm.early_params 1 2 3`: positions in the entry point's parameter list, 0 first);
//! every other `const` pointer parameter loses its `__restrict__`. Without the comment, all of
//! them do.

use super::entry::entry_signature;

/// The comment a kernel's source holds, followed by the positions of its early parameters.
pub const MARKER: &str = "cubellm.early_params";

/// `source` with `__restrict__` dropped from the `const` pointer parameters of the entry point
/// `entry` that its [`MARKER`] does not name, or `None` when nothing changes: the source holds
/// no `griddepcontrol.wait` of its own (the runtime's prologue then waits before every access),
/// the entry point is not found, or every such parameter is named.
pub fn with_coherent_inputs(source: &str, entry: &str) -> Option<String> {
    if !source.contains("griddepcontrol.wait") {
        return None;
    }
    // The positions run to the end of the comment: the closing quote of the `asm` string.
    let early: Vec<usize> = match source.find(MARKER) {
        Some(at) => {
            let rest = &source[at + MARKER.len()..];
            let end = rest.find(['"', '\n']).unwrap_or(rest.len());
            rest[..end]
                .split_whitespace()
                .filter_map(|w| w.parse().ok())
                .collect()
        }
        None => Vec::new(),
    };
    // The parameter list is the last parenthesised group before the body (the parameters
    // hold no parentheses).
    let (sig, body) = entry_signature(source, entry)?;
    let close = sig + source[sig..body].rfind(')')?;
    let open = sig + source[sig..close].rfind('(')? + 1;
    let mut params = String::with_capacity(close - open);
    let mut changed = false;
    for (i, param) in source[open..close].split(',').enumerate() {
        if i > 0 {
            params.push(',');
        }
        let restricted = param.contains("const*") || param.contains("const *");
        if restricted && param.contains("__restrict__") && !early.contains(&i) {
            params.push_str(&param.replacen(" __restrict__", "", 1));
            changed = true;
        } else {
            params.push_str(param);
        }
    }
    if !changed {
        return None;
    }
    let mut rewritten = String::with_capacity(source.len());
    rewritten.push_str(&source[..open]);
    rewritten.push_str(&params);
    rewritten.push_str(&source[close..]);
    Some(rewritten)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SRC: &str = "typedef int i32;\n\
                       __device__ void helper(float const* const __restrict__ p) {\n}\n\
                       extern \"C\" __global__ void __launch_bounds__(256)  gemv_kernel_f32(\
                       float_4 const* const __restrict__ v1, \
                       float_4 const* const __restrict__ v5, \
                       float * const __restrict__ v9, \
                       __grid_constant__ info_st const info_v3) {\n\
                       asm volatile(\"// cubellm.early_params 1\");\n\
                       asm volatile(\"griddepcontrol.wait;\");\n}\n";

    #[test]
    fn only_the_early_parameters_keep_restrict() {
        let out = with_coherent_inputs(SRC, "gemv_kernel_f32").unwrap();
        let params = "(float_4 const* const v1, float_4 const* const __restrict__ v5, \
                      float * const __restrict__ v9, __grid_constant__";
        assert!(out.contains(params), "{out}");
        // The helper's parameter and everything outside the entry's list stay as they were.
        assert!(out.contains("helper(float const* const __restrict__ p)"));
        assert_eq!(out.replacen("const v1", "const __restrict__ v1", 1), SRC);
    }

    #[test]
    fn without_a_marker_every_const_parameter_is_coherent() {
        let plain = SRC.replace("cubellm.early_params 1", "nothing");
        let out = with_coherent_inputs(&plain, "gemv_kernel_f32").unwrap();
        let params = "float_4 const* const v1, float_4 const* const v5, \
                      float * const __restrict__ v9";
        assert!(out.contains(params), "{out}");
    }

    #[test]
    fn kernels_without_their_own_wait_or_entry_stay_as_they_are() {
        let waitless = SRC.replace("griddepcontrol.wait;", "nothing;");
        assert_eq!(with_coherent_inputs(&waitless, "gemv_kernel_f32"), None);
        assert_eq!(with_coherent_inputs(SRC, "gemv_kernel"), None);
        assert_eq!(with_coherent_inputs(SRC, "helper"), None);
        let all_early = SRC.replace("early_params 1", "early_params 0 1");
        assert_eq!(with_coherent_inputs(&all_early, "gemv_kernel_f32"), None);
    }
}
