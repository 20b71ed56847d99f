//! `hob bench` end to end on the tiny fixture (CPU): the JSON rows llama-bench users read, the
//! kernel-time run where the device has no kernel clock, and bad flags.

mod common;

use common::{convert_fixture, hob};

#[test]
fn bench_reports_prefill_and_decode_rows_as_json() {
    let (_dir, path) = convert_fixture("f16");
    let p = path.to_str().unwrap();
    let (ok, stdout, stderr) = hob(&[
        "bench",
        "-m",
        p,
        "--device",
        "cpu",
        "-t",
        "2",
        "-p",
        "8",
        "-n",
        "4",
        "-r",
        "2",
        "-o",
        "json",
        "--kernel-times",
    ]);
    assert!(ok, "{stderr}");
    let rows: serde_json::Value = serde_json::from_str(&stdout).expect("bench -o json prints JSON");
    let rows = rows.as_array().expect("an array of rows");
    assert_eq!(rows.len(), 2, "{stdout}");
    for (row, (test, np, ng)) in rows.iter().zip([("pp8", 8, 0), ("tg4", 0, 4)]) {
        assert_eq!(row["test"], test, "{row}");
        assert_eq!(row["n_prompt"], np, "{row}");
        assert_eq!(row["n_gen"], ng, "{row}");
        assert_eq!(row["backend"], "CPU", "{row}");
        let samples = row["samples_ts"].as_array().expect("samples");
        assert_eq!(samples.len(), 2, "{row}");
        assert!(
            samples.iter().all(|s| s.as_f64().is_some_and(|v| v > 0.0)),
            "{row}"
        );
        let mean = row["avg_ts"].as_f64().unwrap();
        let (lo, hi) = samples
            .iter()
            .map(|s| s.as_f64().unwrap())
            .fold((f64::MAX, 0.0f64), |(a, b), v| (a.min(v), b.max(v)));
        assert!(lo <= mean && mean <= hi, "mean {mean} outside [{lo}, {hi}]");
    }
    // Kernel times need a device clock: on the CPU the bench says so and goes on.
    assert!(
        stderr.contains("--kernel-times: no kernel clock on this device"),
        "{stderr}"
    );
}

#[test]
fn bench_refuses_bad_flags_clearly() {
    let (_dir, path) = convert_fixture("f16");
    let p = path.to_str().unwrap();
    let cases: [(&[&str], &str); 3] = [
        (&["-r", "0"], "at least 1"),
        (&["-p", "0", "-n", "0"], "nothing to measure"),
        (&["-n", "100000"], "at most"),
    ];
    for (extra, want) in cases {
        let mut args = vec!["bench", "-m", p, "--device", "cpu"];
        args.extend_from_slice(extra);
        let (ok, _, stderr) = hob(&args);
        assert!(!ok, "{extra:?} should fail");
        assert!(stderr.contains(want), "{extra:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
}

/// Issue 48: `hob bench` on a model whose context (256) is below the default -p 512 failed; the
/// defaults are clamped to the model's context, and the run says so.
#[test]
fn bench_default_sizes_fit_a_model_of_256_tokens() {
    let (_dir, path) = convert_fixture("f16");
    let p = path.to_str().unwrap();
    let (ok, stdout, stderr) = hob(&["bench", "-m", p, "--device", "cpu", "-r", "1"]);
    assert!(ok, "{stderr}");
    assert!(
        stderr.contains("-p defaults to 512, beyond the model's context of 256: 255"),
        "{stderr}"
    );
    assert!(
        stdout.contains("pp255") && stdout.contains("tg128"),
        "{stdout}"
    );
}
