//! The `cubellm` binary: demo model creation, and one-line errors with a non-zero exit for bad input.
//! Runs on wgpu (lavapipe in CI) since `generate` needs a runtime before it loads anything.

use std::path::PathBuf;
use std::process::{Command, Output};

fn temp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("cubellm-cli-test-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The binary with `args`, its caches under `home`, offline.
fn command(args: &[&str], home: &std::path::Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_cubellm"));
    c.args(args)
        .env("XDG_CACHE_HOME", home.join("cache"))
        .env("HF_HOME", home.join("hf"))
        .env("HF_HUB_OFFLINE", "1")
        // As on a headless server: the binary keeps the graphics drivers' probing quiet itself.
        .env_remove("XDG_RUNTIME_DIR");
    c
}

fn cli(args: &[&str], home: &std::path::Path) -> Output {
    command(args, home).output().unwrap()
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
    // `generate` on wgpu with a model, a prompt and further flags.
    fn generate<'a>(model: &'a str, prompt: &'a str, flags: &[&'a str]) -> Vec<&'a str> {
        let mut args = vec![
            "--runtime",
            "wgpu",
            "generate",
            "--model",
            model,
            "--prompt",
            prompt,
        ];
        args.extend_from_slice(flags);
        args
    }
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (generate("/no/such/dir", "x", &[]), "no such directory"),
        (generate("org/not-cached", "x", &[]), "HF_HUB_OFFLINE"),
        (generate(d, "x", &["--temperature", "-1"]), "temperature"),
        (generate(d, "x", &["--top-p", "0"]), "top_p"),
        // transformers' name of `--repeat-penalty` is accepted, and validated the same way.
        (
            generate(d, "x", &["--repetition-penalty", "0"]),
            "repetition_penalty",
        ),
        (generate(d, "x", &["--dtype", "bf16"]), "bf16"),
        (
            generate(
                d,
                "a prompt of more than three tokens",
                &["--max-len", "3", "--raw"],
            ),
            "context overflow",
        ),
        (generate(d, "x", &["--sparsify", "1.5"]), "sparsity"),
        (
            generate(d, "x", &["--quant-lm-head"]),
            "--quant w8a8, fp8 or w4a16",
        ),
        (
            generate(d, "x", &["--quant", "w4a16", "--quant-decode", "codes"]),
            "--quant w8a8 and fp8 only",
        ),
    ];
    for (args, needle) in cases {
        let o = cli(&args, &home);
        let line = error_line(&o);
        assert!(line.contains(needle), "{args:?}: {line}");
    }
    let bench = |max_len: &str| {
        cli(
            &[
                "--runtime",
                "wgpu",
                "bench-generate",
                "--model",
                d,
                "--prompt-len",
                "8",
                "--new-tokens",
                "4",
                "--runs",
                "1",
                "--max-len",
                max_len,
            ],
            &home,
        )
    };
    let line = error_line(&bench("11"));
    assert!(line.contains("--max-len 11 is shorter"), "{line}");
    // The cache the run was timed on is in its record.
    let o = bench("100");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let record: serde_json::Value =
        serde_json::from_str(String::from_utf8_lossy(&o.stdout).trim()).unwrap();
    assert_eq!(record["max_len"], 100, "{record}");
    // A context far beyond the device is refused before anything is allocated (the RoPE tables
    // alone would take minutes to compute), naming the bytes needed and allowed.
    let start = std::time::Instant::now();
    let line = error_line(&cli(
        &[
            "--runtime",
            "wgpu",
            "generate",
            "--model",
            d,
            "--prompt",
            "x",
            "--max-len",
            "100000000",
        ],
        &home,
    ));
    assert!(
        line.contains("device memory") && line.contains("does not fit") && line.contains("bytes"),
        "{line}"
    );
    assert!(line.contains("largest context that fits"), "{line}");
    assert!(start.elapsed().as_secs() < 30, "took {:?}", start.elapsed());
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

/// A committed transformers fixture of the model crate.
fn fixture(name: &str) -> PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../model/tests/fixtures/hf")
        .join(name)
}

/// `generate` runs every family: greedy from the fixture's prompt prints transformers' greedy
/// continuation (the fixtures' reference), with and without CUDA graphs.
#[test]
fn generate_runs_qwen3_and_llama_checkpoints() {
    for (name, arch, flags) in [
        ("qwen3-gqa-tied", "Qwen3ForCausalLM", &[][..]),
        (
            "qwen3-mha-untied",
            "Qwen3ForCausalLM",
            &["--no-cuda-graph"][..],
        ),
        ("llama3-rope-scaled", "LlamaForCausalLM", &[][..]),
        (
            "llama-bias-untied",
            "LlamaForCausalLM",
            &["--dtype", "f16"][..],
        ),
    ] {
        let dir = fixture(name);
        let meta: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json")).unwrap())
                .unwrap();
        let greedy: Vec<u32> = serde_json::from_value(meta["greedy_ids"].clone()).unwrap();
        let config = model::ModelConfig::from_dir(&dir).unwrap();
        let tok = model::Tokenizer::from_dir(&dir, &config, &Default::default()).unwrap();
        let want = tok.decode(&greedy[..8], true).unwrap();

        let home = temp(name);
        let mut args = vec![
            "--runtime",
            "wgpu",
            "generate",
            "--model",
            dir.to_str().unwrap(),
            "--prompt",
            meta["prompt"].as_str().unwrap(),
            "--raw",
            "--max-new-tokens",
            "8",
        ];
        args.extend_from_slice(flags);
        let o = cli(&args, &home);
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success(), "{name}: {stderr}");
        assert!(
            stderr.contains(&format!("loaded {arch}")),
            "{name}: {stderr}"
        );
        let stdout = String::from_utf8_lossy(&o.stdout);
        assert_eq!(stdout.trim_end(), want.trim_end(), "{name}: {stderr}");
        std::fs::remove_dir_all(&home).unwrap();
    }
}

/// A change to a config.json.
type ConfigEdit = fn(&mut serde_json::Value);

/// Load errors of the new families name the config field, as one error line.
#[test]
fn unsupported_llama_configs_are_one_line_errors() {
    let home = temp("llama-errors");
    let edits: [(&str, ConfigEdit, &[&str]); 3] = [
        ("mlp-bias", |c| c["mlp_bias"] = true.into(), &["mlp_bias"]),
        (
            "rope-type",
            |c| c["rope_parameters"]["rope_type"] = "longrope".into(),
            &["rope_parameters", "longrope"],
        ),
        (
            "rope-missing-factor",
            |c| {
                c["rope_parameters"]
                    .as_object_mut()
                    .unwrap()
                    .remove("low_freq_factor");
            },
            &["rope_parameters.low_freq_factor", "missing"],
        ),
    ];
    for (tag, edit, needles) in edits {
        let dir = home.join(tag);
        std::fs::create_dir_all(&dir).unwrap();
        for f in std::fs::read_dir(fixture("llama3-rope-scaled"))
            .unwrap()
            .flatten()
        {
            std::fs::copy(f.path(), dir.join(f.file_name())).unwrap();
        }
        let path = dir.join("config.json");
        let mut config: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        edit(&mut config);
        std::fs::write(&path, config.to_string()).unwrap();
        let line = error_line(&cli(
            &[
                "--runtime",
                "wgpu",
                "generate",
                "--model",
                dir.to_str().unwrap(),
                "--prompt",
                "x",
            ],
            &home,
        ));
        for needle in needles {
            assert!(line.contains(needle), "{tag}: {line}");
        }
        assert!(line.contains("config.json"), "{tag}: {line}");
    }
    std::fs::remove_dir_all(&home).unwrap();
}

/// Sends SIGINT to a running `generate` once it has written some text: the text so far is kept,
/// the stats line says "cancelled", and the exit status is 130.
#[cfg(unix)]
#[test]
fn ctrl_c_during_generation_keeps_the_text_and_exits_130() {
    use std::io::Read;
    use std::process::Stdio;
    let home = temp("sigint");
    let mut child = command(
        &[
            "--runtime",
            "wgpu",
            "generate",
            "--prompt",
            "Once upon a time",
            "--max-len",
            "100000",
            "--max-new-tokens",
            "90000",
        ],
        &home,
    )
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let mut first = [0u8; 16];
    let n = stdout.read(&mut first).unwrap();
    assert!(n > 0, "no text before the end");
    let kill = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    let mut rest = Vec::new();
    stdout.read_to_end(&mut rest).unwrap();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(130), "stderr: {stderr}");
    assert!(stderr.contains("stop: cancelled"), "stderr: {stderr}");
    // A context beyond the trained one is a note, and the run goes on.
    assert!(
        stderr.contains("note: context 100000 exceeds max_position_embeddings 512"),
        "stderr: {stderr}"
    );
    assert!(
        stderr.lines().last().unwrap().starts_with("interrupted"),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
    // Far fewer tokens than asked for: the run stopped at the signal.
    assert!(rest.len() < 90_000, "{} bytes after the signal", rest.len());
    std::fs::remove_dir_all(&home).unwrap();
}

/// `--runtime cuda` on a machine without an NVIDIA driver is one line naming what is missing;
/// on a machine with one it runs.
#[test]
fn cuda_without_a_driver_is_one_line() {
    let home = temp("no-cuda");
    let o = cli(
        &[
            "--runtime",
            "cuda",
            "generate",
            "--prompt",
            "x",
            "--max-new-tokens",
            "1",
        ],
        &home,
    );
    if !o.status.success() {
        let line = error_line(&o);
        assert!(
            line.contains("the cuda runtime has no usable device"),
            "{line}"
        );
    }
    std::fs::remove_dir_all(&home).unwrap();
}

/// `chat` reads messages and commands from stdin: its first answer is `generate`'s answer to the
/// same system and user message with the same seed, `/reset` starts over (so the same question
/// gets the same answer again), and unknown commands or end of input are not errors.
#[test]
fn chat_answers_like_generate_and_reset_starts_over() {
    use std::io::Write;
    let home = temp("chat");
    let common = [
        "--max-new-tokens",
        "8",
        "--seed",
        "5",
        "--temperature",
        "0.8",
    ];
    let mut generate_args = vec![
        "--runtime",
        "wgpu",
        "generate",
        "--system",
        "be brief",
        "--prompt",
        "hello",
    ];
    generate_args.extend(common);
    let g = cli(&generate_args, &home);
    assert!(g.status.success(), "{}", String::from_utf8_lossy(&g.stderr));
    let answer = String::from_utf8(g.stdout).unwrap();
    assert!(answer.ends_with('\n') && answer.len() > 1, "{answer:?}");

    let mut chat_args = vec!["--runtime", "wgpu", "chat", "--system", "be brief"];
    chat_args.extend(common);
    let mut child = command(&chat_args, &home)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"hello\n/frobnicate\n/reset\nhello\n")
        .unwrap();
    let o = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{stderr}");
    assert!(stderr.contains("unknown command /frobnicate"), "{stderr}");
    assert!(stderr.contains("conversation cleared"), "{stderr}");
    assert_eq!(String::from_utf8(o.stdout).unwrap(), answer.repeat(2));
    std::fs::remove_dir_all(&home).unwrap();
}

/// `serve` prints where it listens, answers there, and drains and exits 0 on SIGTERM; a port in
/// use is a one-line error before the model is loaded.
#[test]
fn serve_answers_and_stops_cleanly_on_sigterm() {
    use std::io::{BufRead, BufReader, Read, Write};
    use std::process::Stdio;
    let home = temp("serve");
    let mut child = command(&["--runtime", "wgpu", "serve", "--port", "0"], &home)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let mut seen = String::new();
    let addr = loop {
        let mut line = String::new();
        assert!(
            stderr.read_line(&mut line).unwrap() > 0,
            "no address in: {seen}"
        );
        seen.push_str(&line);
        if let Some(rest) = line.split("http://").nth(1) {
            break rest.split_whitespace().next().unwrap().to_string();
        }
    };
    assert!(seen.contains("serving cubellm-demo"), "{seen}");

    // A plain HTTP/1.1 exchange over a socket.
    let mut socket = std::net::TcpStream::connect(&addr).unwrap();
    let body = r#"{"prompt": "Hi", "max_tokens": 3, "ignore_eos": true}"#;
    write!(
        socket,
        "POST /v1/completions HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut response = String::new();
    socket.read_to_string(&mut response).unwrap();
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    assert!(response.contains("\"completion_tokens\":3"), "{response}");

    // The same port again: taken.
    let port = addr.rsplit(':').next().unwrap();
    let o = cli(&["--runtime", "wgpu", "serve", "--port", port], &home);
    let line = error_line(&o);
    assert!(line.contains("cannot listen on"), "{line}");

    let kill = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    let mut rest = String::new();
    stderr.read_to_string(&mut rest).unwrap();
    let status = child.wait().unwrap();
    assert!(status.success(), "{status}: {rest}");
    assert!(rest.contains("stopped"), "{rest}");
    std::fs::remove_dir_all(&home).unwrap();
}
