//! Finding a kernel's entry point in its CUDA source, for the source rewrites beside this file
//! (std only, like them, so that cubellm's tests include it with them).

/// Where the entry point `entry` is defined in `source`: the index of its `extern "C" __global__`
/// and of the `{` that opens its body, or `None` when no definition of that name is found.
///
/// The signature is `extern "C" __global__ <ty> __launch_bounds__(n) [cluster] name(...)`; the
/// parameters hold no braces, so the body opens at the first `{` after the name.
pub fn entry_signature(source: &str, entry: &str) -> Option<(usize, usize)> {
    let marker = "extern \"C\" __global__";
    let mut from = 0;
    while let Some(found) = source[from..].find(marker) {
        let sig = from + found;
        let body = source[sig..].find('{').map(|i| sig + i)?;
        let header = &source[sig..body];
        let named = header
            .match_indices(entry)
            .any(|(i, _)| header[i + entry.len()..].trim_start().starts_with('('));
        if named {
            return Some((sig, body));
        }
        from = body;
    }
    None
}
