//! The `cli` binary: demo model creation, and one-line errors with a non-zero exit for bad input.
//! Runs on wgpu (lavapipe in CI) since `generate` needs a runtime before it loads anything.

use std::path::PathBuf;
use std::process::{Command, Output};

fn temp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("cubellm-cli-test-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn cli(args: &[&str], home: &std::path::Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_cubellm"))
        .args(args)
        .env("XDG_CACHE_HOME", home.join("cache"))
        .env("HF_HOME", home.join("hf"))
        .env("HF_HUB_OFFLINE", "1")
        .env(
            "XDG_RUNTIME_DIR",
            std::env::var("XDG_RUNTIME_DIR").unwrap_or("/tmp".into()),
        )
        .output()
        .unwrap()
}

/// The last line of stderr, which must be the only `error:` line.
fn error_line(out: &Output) -> String {
    assert!(!out.status.success(), "expected failure, got success");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let errors: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error")).collect();
    assert_eq!(errors.len(), 1, "stderr: {stderr}");
    assert!(!stderr.contains("panicked"), "stderr: {stderr}");
    errors[0].to_string()
}

#[test]
fn make_demo_model_writes_a_loadable_model() {
    let home = temp("make-demo");
    let out = home.join("demo");
    let o = cli(&["make-demo-model", "--out", out.to_str().unwrap()], &home);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    for f in [
        "config.json",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "model.safetensors",
    ] {
        assert!(out.join(f).is_file(), "{f}");
    }
    std::fs::remove_dir_all(&home).unwrap();
}

#[test]
fn bad_input_is_one_line_and_a_failure() {
    let home = temp("errors");
    let demo = home.join("demo");
    assert!(
        cli(&["make-demo-model", "--out", demo.to_str().unwrap()], &home)
            .status
            .success()
    );
    let d = demo.to_str().unwrap();
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec![
                "--runtime",
                "wgpu",
                "generate",
                "--model",
                "/no/such/dir",
                "--prompt",
                "x",
            ],
            "no such directory",
        ),
        (
            vec![
                "--runtime",
                "wgpu",
                "generate",
                "--model",
                "org/not-cached",
                "--prompt",
                "x",
            ],
            "HF_HUB_OFFLINE",
        ),
        (
            vec![
                "--runtime",
                "wgpu",
                "generate",
                "--model",
                d,
                "--prompt",
                "x",
                "--temperature",
                "-1",
            ],
            "temperature",
        ),
        (
            vec![
                "--runtime",
                "wgpu",
                "generate",
                "--model",
                d,
                "--prompt",
                "x",
                "--top-p",
                "0",
            ],
            "top_p",
        ),
        (
            vec![
                "--runtime",
                "wgpu",
                "generate",
                "--model",
                d,
                "--prompt",
                "x",
                "--dtype",
                "bf16",
            ],
            "bf16",
        ),
        (
            vec![
                "--runtime",
                "wgpu",
                "generate",
                "--model",
                d,
                "--prompt",
                "a prompt of more than three tokens",
                "--max-len",
                "3",
                "--raw",
            ],
            "context overflow",
        ),
        (
            vec![
                "--runtime",
                "wgpu",
                "generate",
                "--model",
                d,
                "--prompt",
                "x",
                "--sparsify",
                "1.5",
            ],
            "sparsity",
        ),
        (
            vec![
                "--runtime",
                "wgpu",
                "generate",
                "--model",
                d,
                "--prompt",
                "x",
                "--quant-lm-head",
            ],
            "--quant w8a8, fp8 or w4a16",
        ),
    ];
    for (args, needle) in cases {
        let o = cli(&args, &home);
        let line = error_line(&o);
        assert!(line.contains(needle), "{args:?}: {line}");
    }
    // A corrupt checkpoint.
    let bytes = std::fs::read(demo.join("model.safetensors")).unwrap();
    std::fs::write(demo.join("model.safetensors"), &bytes[..bytes.len() / 3]).unwrap();
    let line = error_line(&cli(
        &[
            "--runtime",
            "wgpu",
            "generate",
            "--model",
            d,
            "--prompt",
            "x",
        ],
        &home,
    ));
    assert!(
        line.contains("model.safetensors") && line.contains("truncated"),
        "{line}"
    );
    std::fs::remove_dir_all(&home).unwrap();
}

#[test]
fn without_a_model_the_demo_model_is_used() {
    let home = temp("default");
    let o = cli(
        &[
            "--runtime",
            "wgpu",
            "generate",
            "--prompt",
            "Hello",
            "--max-new-tokens",
            "4",
        ],
        &home,
    );
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(stderr.contains("built-in demo model"), "{stderr}");
    assert!(home
        .join("cache/cubellm")
        .join(model::demo::DEMO_VERSION)
        .join("model.safetensors")
        .is_file());
    assert!(o.status.success(), "{stderr}");
    assert!(
        stderr.contains("decode") && stderr.contains("time to first token"),
        "{stderr}"
    );
    assert!(!o.stdout.is_empty(), "no generated text on stdout");
    std::fs::remove_dir_all(&home).unwrap();
}

/// Generates 3 tokens from the demo model with `flags`; returns stderr after checking success.
fn generate_ok(name: &str, flags: &[&str]) -> String {
    let home = temp(name);
    let mut args = vec![
        "--runtime",
        "wgpu",
        "generate",
        "--prompt",
        "Hello",
        "--max-new-tokens",
        "3",
    ];
    args.extend_from_slice(flags);
    let o = cli(&args, &home);
    let stderr = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(o.status.success(), "{stderr}");
    std::fs::remove_dir_all(&home).unwrap();
    stderr
}

#[test]
fn sparsify_reports_the_weight_memory() {
    let stderr = generate_ok("sparsify", &["--sparsify", "0.5"]);
    assert!(
        stderr.contains("MB dense") && stderr.contains("50% block sparsity"),
        "{stderr}"
    );
}

#[test]
fn quant_reports_the_weight_memory() {
    let stderr = generate_ok("quant", &["--quant", "fp8"]);
    assert!(
        stderr.contains("quantized to fp8, LM head in float"),
        "{stderr}"
    );
}
