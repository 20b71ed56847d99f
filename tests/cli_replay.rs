//! `--replay-trace` end to end on the tiny fixture (CPU): replaying a run's own trace reproduces
//! its perplexity exactly, a changed trace changes it (the routing really comes from the trace),
//! the stacked gates' recorded predictions reach the predictor, and traces that cannot route the
//! model are clear errors.

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
    // A one-record trace routing top-2 of `experts` (a, b).
    let trace = |name: &str, experts: usize, (a, b): (usize, usize)| {
        let path = dir.path().join(name);
        std::fs::write(
            &path,
            format!(
                "{{\"hob_trace\":1,\"model\":\"x\",\"layers\":1,\"experts\":{experts},\"top_k\":2,\
                 \"high\":\"f16\",\"low\":null,\"high_bytes\":1,\"low_bytes\":0,\"t1\":1,\"t2\":1}}\n\
                 {{\"seq\":0,\"tok\":0,\"layer\":0,\"routes\":[[{a},0.6,\"high\"],[{b},0.4,\"high\"]]}}\n"
            ),
        )
        .unwrap();
        path.to_str().unwrap().to_string()
    };
    let e = &trace("eight.jsonl", 8, (1, 5));
    // The model's shape, but no predictions recorded (as an older hob wrote traces).
    let f = &trace("four.jsonl", 4, (1, 3));
    let cases: [(Vec<&str>, &str); 4] = [
        (
            vec!["run", "-m", m, "-p", "hi", "--prefetch-min-weight", "2"],
            "--prefetch-min-weight 2: give a gate weight between 0 and 1",
        ),
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
                f,
                "--prefetch",
                "1",
            ],
            "the trace records no stacked-gate predictions",
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

/// The "prediction 1 layer(s) ahead: X% of predicted experts routed" share of a `run --stats`.
fn prediction_share(stderr: &str) -> f64 {
    stderr
        .lines()
        .find_map(|l| l.trim().strip_prefix("prediction 1 layer(s) ahead: "))
        .and_then(|rest| rest.split('%').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no prediction accuracy in:\n{stderr}"))
}

#[test]
fn recorded_predictions_are_replayed_to_the_prefetcher() {
    let (dir, model) = convert_fixture("f16");
    let m = model.to_str().unwrap();
    let text = dir.path().join("text.txt");
    std::fs::write(
        &text,
        "Whether 'tis nobler in the mind to suffer. ".repeat(8),
    )
    .unwrap();
    let trace = dir.path().join("trace.jsonl");
    perplexity_stdout(
        &model,
        &text,
        32,
        &["--record-trace", trace.to_str().unwrap()],
    );
    let lines: Vec<serde_json::Value> = std::fs::read_to_string(&trace)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    // The fixture has 2 layers: layer 0 predicts layer 1, layer 1 nothing.
    assert_eq!(lines[0]["pred_depth"], 1, "{}", lines[0]);
    for r in &lines[1..] {
        let pred = r.get("pred").and_then(|p| p.as_array());
        if r["layer"] == 0 {
            let pred = pred.unwrap_or_else(|| panic!("no prediction in {r}"));
            assert_eq!(pred.len(), 1);
            assert_eq!(pred[0].as_array().unwrap().len(), 2, "{r}");
        } else {
            assert!(pred.is_none(), "the last layer predicts nothing: {r}");
        }
    }
    // Every layer-0 prediction replaced by the token's real layer-1 routes, then by the two
    // experts it does not route: the replayed predictor scores 100% and 0%.
    let rewrite = |name: &str, hit: bool| {
        let mut out = vec![lines[0].to_string()];
        for (i, r) in lines.iter().enumerate().skip(1) {
            let mut r = r.clone();
            if r["layer"] == 0 {
                let next: Vec<u64> = lines[i + 1]["routes"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|x| x[0].as_u64().unwrap())
                    .collect();
                let experts: Vec<u64> = if hit {
                    next
                } else {
                    (0..4).filter(|e| !next.contains(e)).collect()
                };
                r["pred"] = serde_json::json!([[[experts[0], 0.7], [experts[1], 0.3]]]);
            }
            out.push(r.to_string());
        }
        let path = dir.path().join(name);
        std::fs::write(&path, out.join("\n")).unwrap();
        path
    };
    for (name, hit, want) in [("hit.jsonl", true, 100.0), ("miss.jsonl", false, 0.0)] {
        let path = rewrite(name, hit);
        let p = path.to_str().unwrap();
        let args = [
            "run",
            "-m",
            m,
            "-p",
            "To be",
            "-n",
            "6",
            "--replay-trace",
            p,
            "--prefetch",
            "1",
            "--stats",
        ];
        let (ok, _, stderr) = hob(&args);
        assert!(ok, "{args:?}: {stderr}");
        assert_eq!(prediction_share(&stderr), want, "{name}: {stderr}");
    }
}
