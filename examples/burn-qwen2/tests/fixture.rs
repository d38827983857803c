//! The example as a test: on every runtime the tests run on (`testkit::backends`, restricted by
//! `CUBELLM_TEST_RUNTIMES`), both models' logits and greedy tokens must match transformers'
//! fixture and each other. The program checks that itself and exits non-zero on any mismatch;
//! the test also requires its final verdict line.
use std::process::Command;

#[test]
fn both_models_match_transformers_on_each_runtime() {
    for backend in testkit::backends() {
        let out = Command::new(env!("CARGO_BIN_EXE_burn-qwen2"))
            .args(["--runtime", backend.name()])
            .args(["--decode", "4", "--repeats", "1"])
            .output()
            .expect("burn-qwen2 runs");
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success() && stdout.contains("ok: both models match"),
            "burn-qwen2 on {}: {}\nstdout:\n{stdout}\nstderr:\n{stderr}",
            backend.name(),
            out.status
        );
    }
}
