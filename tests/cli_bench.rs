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

/// The machine's cores, as hob caps -t at them.
fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// `hob bench -o json` with `extra` flags on the CPU: the rows.
fn bench_json(p: &str, extra: &[&str]) -> Vec<serde_json::Value> {
    let mut args = vec!["bench", "-m", p, "--device", "cpu", "-r", "1", "-o", "json"];
    args.extend_from_slice(extra);
    let (ok, stdout, stderr) = hob(&args);
    assert!(ok, "{args:?}: {stderr}");
    let rows: serde_json::Value = serde_json::from_str(&stdout).expect("bench -o json prints JSON");
    rows.as_array().expect("an array of rows").clone()
}

/// Issue 49 item 13: `-p 64,128 -n 32 -t 1,2` was refused; llama-bench runs every combination,
/// one row per test per thread count, in its order: for each thread count, the prefill tests and
/// then the decode tests.
#[test]
fn bench_comma_lists_run_every_combination_in_llama_bench_order() {
    let (_dir, path) = convert_fixture("f16");
    let rows = bench_json(
        path.to_str().unwrap(),
        &["-p", "16,32", "-n", "8", "-t", "1,2"],
    );
    let got: Vec<(u64, String)> = rows
        .iter()
        .map(|r| (r["n_threads"].as_u64().unwrap(), r["test"].to_string()))
        .collect();
    let two = 2.min(cores()) as u64;
    let want: Vec<(u64, String)> = [1, two]
        .iter()
        .flat_map(|&t| ["pp16", "pp32", "tg8"].map(|test| (t, format!("\"{test}\""))))
        .collect();
    assert_eq!(got, want);
    // A size 0 in a list is skipped, as llama-bench does.
    let rows = bench_json(path.to_str().unwrap(), &["-p", "0,16", "-n", "0"]);
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0]["test"], "pp16");
}

/// Issue 49 item 13: the size and params columns described the whole file (every variant) and
/// params was empty; they are the dense weights plus the experts in the variant benchmarked, as
/// `hob inspect` counts them, and the table has llama-bench's threads column.
#[test]
fn bench_size_and_params_are_the_benchmarked_variants() {
    let (_dir, path) = convert_fixture("f16,int4");
    let p = path.to_str().unwrap();
    let (ok, stdout, stderr) = hob(&["inspect", "--json", p]);
    assert!(ok, "{stderr}");
    let info: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    let tensors = info["tensors"].as_array().unwrap();
    let dense_bytes: u64 = tensors.iter().map(|t| t["bytes"].as_u64().unwrap()).sum();
    let dense_params: u64 = tensors
        .iter()
        .map(|t| {
            t["shape"]
                .as_array()
                .unwrap()
                .iter()
                .map(|d| d.as_u64().unwrap())
                .product::<u64>()
        })
        .sum();
    let e = &info["experts"];
    let n = e["layers"].as_u64().unwrap() * e["experts_per_layer"].as_u64().unwrap();
    let params = dense_params + n * 3 * e["hidden"].as_u64().unwrap() * e["ffn"].as_u64().unwrap();
    let variant_bytes = |name: &str| {
        e["variants"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["variant"].as_str().unwrap().starts_with(name))
            .map(|v| v["bytes"].as_u64().unwrap())
            .unwrap()
    };
    let file_size = info["header"]["file_size"].as_u64().unwrap();
    for variant in ["f16", "int4"] {
        let rows = bench_json(p, &["-p", "8", "-n", "0", "--expert-variant", variant]);
        let size = dense_bytes + variant_bytes(variant);
        assert_eq!(rows[0]["size_bytes"].as_u64(), Some(size), "{variant}");
        assert!(size < file_size, "{variant}: {size} of {file_size}");
        assert_eq!(rows[0]["params"].as_u64(), Some(params), "{variant}");
    }
    // With --low, both variants computed with count.
    let rows = bench_json(p, &["-p", "8", "-n", "0", "--low", "int4"]);
    let both = dense_bytes + variant_bytes("f16") + variant_bytes("int4");
    assert_eq!(rows[0]["size_bytes"].as_u64(), Some(both));
    // The markdown table: a threads column after the backend, and a params figure.
    let (ok, md, stderr) = hob(&[
        "bench", "-m", p, "--device", "cpu", "-r", "1", "-p", "8", "-n", "0", "-t", "1",
    ]);
    assert!(ok, "{stderr}");
    let lines: Vec<&str> = md.lines().collect();
    assert!(lines[0].contains("| backend | threads |"), "{md}");
    assert!(lines[2].contains("| CPU     |       1 |"), "{md}");
    assert!(!lines[2].contains("|      - | CPU"), "params empty: {md}");
}

/// Issue 49 item 7: -t far above the cores was accepted and ran 7-100x slower (the pool spins);
/// bench caps every count at the cores with a note, and its rows show the threads used.
#[test]
fn bench_thread_counts_above_the_cores_are_capped() {
    let (_dir, path) = convert_fixture("f16");
    let p = path.to_str().unwrap();
    let c = cores();
    let (ok, stdout, stderr) = hob(&[
        "bench", "-m", p, "--device", "cpu", "-r", "1", "-p", "8", "-n", "0", "-t", "1,1000", "-o",
        "json",
    ]);
    assert!(ok, "{stderr}");
    if c < 1000 {
        let plural = if c == 1 { "" } else { "s" };
        let note = format!("-t 1000: this machine has {c} core{plural}; using {c}");
        assert!(stderr.contains(&note), "{stderr}");
    }
    let rows: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    let threads: Vec<u64> = rows
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["n_threads"].as_u64().unwrap())
        .collect();
    assert_eq!(threads, [1, c.min(1000) as u64]);
}

/// Issue 49 items 12 and 13: a bad value in a list is refused by its flag and value.
#[test]
fn bench_refuses_bad_list_values_by_name() {
    let (_dir, path) = convert_fixture("f16");
    let p = path.to_str().unwrap();
    let cases: [(&[&str], &str); 4] = [
        (&["-p", "16,100000"], "-p 100000: at most 255 tokens"),
        (&["-n", "8,x"], "'x'"),
        (&["-t", "1,-5"], "-t -5:"),
        (&["-p", "0", "-n", "0,0"], "nothing to measure"),
    ];
    for (extra, want) in cases {
        let mut args = vec!["bench", "-m", p, "--device", "cpu", "-r", "1"];
        args.extend_from_slice(extra);
        let (ok, _, stderr) = hob(&args);
        assert!(!ok, "{extra:?} should fail");
        assert!(stderr.contains(want), "{extra:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
}

/// Issue 50 item 4: the projection onto a profile's memory is for CUDA decode rows only. On the
/// CPU, with a profile whose memory is far below any GPU's, the JSON has the field as null and
/// the table keeps its 14 columns.
#[test]
fn bench_projects_nothing_on_the_cpu() {
    let (_dir, path) = convert_fixture("f16");
    let p = path.to_str().unwrap();
    // The profile's int4/int2 pair is not in the fixture: its f16 alone.
    let flags = [
        "-p",
        "0",
        "-n",
        "4",
        "--platform",
        "jetson-orin-nx-16g",
        "--expert-variant",
        "f16",
        "--low",
        "none",
    ];
    let rows = bench_json(p, &flags);
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0]["profile"], "jetson-orin-nx-16g");
    assert!(rows[0]["projected_ts"].is_null(), "{}", rows[0]);
    assert!(rows[0]["gpu_busy_per_token_s"].is_null(), "{}", rows[0]);
    let mut args = vec!["bench", "-m", p, "--device", "cpu", "-r", "1"];
    args.extend_from_slice(&flags);
    let (ok, md, stderr) = hob(&args);
    assert!(ok, "{stderr}");
    assert!(!md.contains("projected"), "{md}");
    assert!(!stderr.contains("projection"), "{stderr}");
    assert!(md.lines().all(|l| l.matches(" |").count() == 14), "{md}");
}
