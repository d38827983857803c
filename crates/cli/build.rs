//! Records the commit the binary is built from, for the benchmark records (`bench-generate
//! --record`): `git describe`-like `<short hash>[-dirty]`, or nothing outside a git checkout.

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn main() {
    if let Some(hash) = git(&["rev-parse", "--short=12", "HEAD"]) {
        let dirty =
            git(&["status", "--porcelain", "--untracked-files=no"]).is_some_and(|s| !s.is_empty());
        let suffix = if dirty { "-dirty" } else { "" };
        println!("cargo:rustc-env=CUBELLM_BUILD_COMMIT={hash}{suffix}");
    }
    // Re-run when HEAD moves, the branch it names moves (a commit rewrites the branch's ref
    // file, not HEAD) or the index changes (staging, a checkout).
    if let Some(dir) = git(&["rev-parse", "--git-dir"]) {
        println!("cargo:rerun-if-changed={dir}/HEAD");
        println!("cargo:rerun-if-changed={dir}/index");
        if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
            let path = format!("{dir}/{branch}");
            // A missing file would re-run the script on every build (packed refs).
            if std::path::Path::new(&path).exists() {
                println!("cargo:rerun-if-changed={path}");
            }
        }
    }
}
