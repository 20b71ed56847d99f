//! `--replay-trace` end to end on the tiny fixture (CPU): replaying a run's own trace reproduces
//! its perplexity exactly, a changed trace changes it (the routing really comes from the trace),
//! and traces that cannot route the model are clear errors.

mod common;

use std::path::Path;

use common::{convert_fixture, hob, perplexity_stdout};

/// The final perplexity estimate, with dynamic precision on (so the scorer reads the weights).
fn perplexity(model: &Path, text: &Path, extra: &[&str]) -> String {
    let mut args = vec!["--low", "int4", "--t1", "0.55", "--t2", "0.8"];
    args.extend_from_slice(extra);
    let stdout = perplexity_stdout(model, text, 32, &args);
    stdout
        .split("Final estimate: PPL = ")
        .nth(1)
        .unwrap_or_else(|| panic!("no final estimate in:\n{stdout}"))
        .trim()
        .to_string()
}

#[test]
fn replaying_a_trace_reproduces_its_run_and_a_changed_trace_changes_it() {
    let (dir, model) = convert_fixture("f16,int4");
    let text = dir.path().join("text.txt");
    std::fs::write(
        &text,
        "To be, or not to be, that is the question: whether 'tis nobler in the mind. ".repeat(8),
    )
    .unwrap();
    let trace = dir.path().join("trace.jsonl");
    let t = trace.to_str().unwrap();
    let recorded = perplexity(&model, &text, &["--record-trace", t]);
    let replayed = perplexity(&model, &text, &["--replay-trace", t]);
    assert_eq!(replayed, recorded);

    // Every route moved to the next expert (weights kept): the same text, another routing.
    let lines: Vec<String> = std::fs::read_to_string(&trace)
        .unwrap()
        .lines()
        .enumerate()
        .map(|(i, line)| {
            let mut v: serde_json::Value = serde_json::from_str(line).unwrap();
            if i > 0 {
                for r in v["routes"].as_array_mut().unwrap() {
                    r[0] = ((r[0].as_u64().unwrap() + 1) % 4).into();
                }
            }
            v.to_string()
        })
        .collect();
    let shifted = dir.path().join("shifted.jsonl");
    std::fs::write(&shifted, lines.join("\n")).unwrap();
    let other = perplexity(
        &model,
        &text,
        &["--replay-trace", shifted.to_str().unwrap()],
    );
    assert_ne!(other, recorded);
    assert_ne!(perplexity(&model, &text, &[]), other);
}

#[test]
fn traces_that_cannot_route_the_model_are_clear_errors() {
    let (dir, model) = convert_fixture("f16");
    let m = model.to_str().unwrap();
    let eight = dir.path().join("eight.jsonl");
    std::fs::write(
        &eight,
        "{\"hob_trace\":1,\"model\":\"x\",\"layers\":1,\"experts\":8,\"top_k\":2,\"high\":\"f16\",\
         \"low\":null,\"high_bytes\":1,\"low_bytes\":0,\"t1\":1,\"t2\":1}\n\
         {\"seq\":0,\"tok\":0,\"layer\":0,\"routes\":[[1,0.6,\"high\"],[5,0.4,\"high\"]]}\n",
    )
    .unwrap();
    let e = eight.to_str().unwrap();
    let cases: [(Vec<&str>, &str); 3] = [
        (
            vec!["run", "-m", m, "-p", "hi", "-n", "2", "--replay-trace", e],
            "the trace routes top-2 of 8 experts, the model top-2 of 4",
        ),
        (
            vec![
                "run",
                "-m",
                m,
                "-p",
                "hi",
                "--replay-trace",
                e,
                "--prefetch",
                "1",
            ],
            "--replay-trace with --prefetch",
        ),
        (
            vec![
                "run",
                "-m",
                m,
                "-p",
                "hi",
                "--replay-trace",
                "/nonexistent.jsonl",
            ],
            "/nonexistent.jsonl",
        ),
    ];
    for (args, want) in cases {
        let (ok, _, stderr) = hob(&args);
        assert!(!ok, "{args:?} succeeded");
        assert!(stderr.contains(want), "{args:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
    }
}
