//! `hob calibrate` and `hob perplexity --kl-baseline` end to end on the tiny fixture (random
//! weights): the fitted profile loads back, the exact mode has KL exactly 0, and "top-1 only"
//! skips exactly half of the top-2 routes.

mod common;

use std::path::Path;

use common::{convert_fixture, hob, perplexity_run, perplexity_stdout};
use hob::platform::Platform;

fn text(dir: &Path) -> std::path::PathBuf {
    let path = dir.join("text.txt");
    std::fs::write(
        &path,
        "To be, or not to be, that is the question: whether 'tis nobler in the mind to suffer \
         the slings and arrows of outrageous fortune. "
            .repeat(12),
    )
    .unwrap();
    path
}

/// The number after `key` in `out`.
fn number_after(out: &str, key: &str) -> f64 {
    out.split(key)
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .and_then(|s| s.trim_end_matches(',').parse().ok())
        .unwrap_or_else(|| panic!("no number after {key:?} in:\n{out}"))
}

fn perplexity(model: &Path, text: &Path, extra: &[&str]) -> String {
    let mut args = vec!["--kl-baseline"];
    args.extend_from_slice(extra);
    perplexity_stdout(model, text, 64, &args)
}

#[test]
fn exact_mode_has_zero_kl_and_top1_only_skips_half() {
    let (dir, model) = convert_fixture("f16,int4");
    let text = text(dir.path());

    // T1 = T2 = 1 with a low variant named: every route high, the same computation as the
    // baseline, so the distributions are bit-identical.
    let out = perplexity(&model, &text, &["--low", "int4", "--t1", "1", "--t2", "1"]);
    assert_eq!(number_after(&out, "Mean KL(baseline || tested): "), 0.0);
    assert_eq!(number_after(&out, "Maximum KL: "), 0.0);
    assert_eq!(number_after(&out, "Same top token: "), 100.0);
    assert_eq!(
        number_after(&out, "Final estimate: PPL = "),
        number_after(&out, "): PPL = ")
    );
    assert!(out.contains("Routes: high 100.00 %"), "{out}");
    assert!(out.contains("skipped 0.00 %"), "{out}");

    // T1 = T2 = 0: only each token's top-1 expert runs, the other of top-2 is skipped.
    let out = perplexity(&model, &text, &["--t1", "0", "--t2", "0"]);
    let kl = number_after(&out, "Mean KL(baseline || tested): ");
    assert!(kl > 0.0 && kl.is_finite(), "{out}");
    assert!(number_after(&out, "99th percentile KL: ") >= kl, "{out}");
    assert!(out.contains("Routes: high 50.00 %"), "{out}");
    assert!(out.contains("skipped 50.00 %"), "{out}");
    assert_ne!(
        number_after(&out, "Final estimate: PPL = "),
        number_after(&out, "): PPL = ")
    );

    // int4 for the low-scored experts with HOBBIT's defaults: some KL, high and low both used.
    let out = perplexity(&model, &text, &["--low", "int4"]);
    assert!(number_after(&out, "Mean KL(baseline || tested): ") > 0.0);
    let (h, l, s) = (
        number_after(&out, "Routes: high "),
        number_after(&out, "), low "),
        number_after(&out, "skipped "),
    );
    assert!(
        h >= 50.0 && l > 0.0 && (h + l + s - 100.0).abs() < 0.02,
        "{out}"
    );
}

#[test]
fn calibrated_profile_round_trips_and_drives_perplexity() {
    let (dir, model) = convert_fixture("f16,int4");
    let text = text(dir.path());
    let profile = dir.path().join("cal.toml");
    let (ok, out, stderr) = hob(&[
        "calibrate",
        "-m",
        model.to_str().unwrap(),
        "-f",
        text.to_str().unwrap(),
        "-c",
        "64",
        "--platform",
        "rtx4090-24g",
        "-o",
        profile.to_str().unwrap(),
    ]);
    assert!(ok, "{stderr}");
    assert!(out.contains("scores of the non-top-1 routes"), "{out}");
    let t1 = number_after(&out, "fitted: T1 = ") as f32;
    let t2 = number_after(&out, ", T2 = ") as f32;
    assert!(0.0 < t1 && t1 < t2 && t2 < 1.0, "{out}");
    // The split on the calibration text is close to the target (hundreds of routes).
    let fitted = out.split("fitted: ").nth(1).unwrap();
    let high = number_after(fitted, "-> ");
    assert!((high - 67.0).abs() < 1.0, "{out}");
    assert!(out.contains("HOBBIT's Mixtral defaults T1 = 0.6, T2 = 0.9 -> "));

    let p = Platform::load(&profile).unwrap();
    let mut want = Platform::resolve("rtx4090-24g").unwrap();
    want.name = "rtx4090-24g-calibrated".into();
    want.t1 = Some(t1);
    want.t2 = Some(t2);
    assert_eq!(p, want);

    // The CLI loads it: its low variant and thresholds drive the dynamic run.
    let out = perplexity(&model, &text, &["--platform", profile.to_str().unwrap()]);
    assert!(
        out.contains(&format!("(T1 {t1}, T2 {t2})")),
        "T1 {t1}, T2 {t2}:\n{out}"
    );
    let h = number_after(&out, "Routes: high ");
    assert!((50.0..90.0).contains(&h), "{out}");
}

#[test]
fn calibrate_input_errors_are_clear() {
    let (dir, model) = convert_fixture("f16");
    let text = text(dir.path());
    let m = model.to_str().unwrap();
    let t = text.to_str().unwrap();
    let out = dir.path().join("p.toml");
    let o = out.to_str().unwrap();
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["--split", "67/33"], "--split 67/33: expected three"),
        (vec!["--split", "60/30/30"], "sum to 120"),
        (
            vec!["--split", "80/x/20"],
            "'x' is not a non-negative number",
        ),
        (vec!["--split", "40/50/10"], "below the top-1 share 50.0 %"),
        (vec!["-o", o], "--platform"),
        (vec!["--platform", "nowhere.toml", "-o", o], "nowhere.toml"),
        (
            vec!["-c", "4096"],
            "-c/--ctx-size 4096: the context length of ",
        ),
        (vec!["--low", "int2"], "--low int2"),
        (
            vec!["--widths"],
            "stores no ap8 variant (its variants: f16)",
        ),
        (vec!["--bits", "5"], "--widths"),
    ];
    for (extra, needle) in cases {
        let mut args = vec!["calibrate", "-m", m, "-f", t];
        args.extend_from_slice(&extra);
        let (ok, _, stderr) = hob(&args);
        assert!(!ok, "{args:?} succeeded");
        assert!(
            stderr.contains(needle),
            "{args:?}: stderr lacks {needle:?}:\n{stderr}"
        );
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
    assert!(!out.exists());
}

/// Issue 54: `--widths` on an ap8 file runs each pair over the text with the fitted T1/T2 and
/// picks the least KL within the default pair's bits (ap8@5 + ap8@3, added to the list); the
/// profile it writes runs that pair. A pair's KL is what `hob perplexity --kl-baseline` reports
/// for it.
#[test]
fn ap8_width_bands_are_fitted_within_the_default_pairs_bits() {
    let (dir, model) = convert_fixture("ap8");
    let text = text(dir.path());
    let profile = dir.path().join("w.toml");
    let m = model.to_str().unwrap();
    let args = [
        "calibrate",
        "-m",
        m,
        "-f",
        text.to_str().unwrap(),
        "-c",
        "64",
    ];
    let (ok, out, stderr) = hob(&[
        &args[..],
        &["--widths", "8:3,6:3,4:2", "--platform", "jetson-orin-32g"],
        &["-o", profile.to_str().unwrap()],
    ]
    .concat());
    assert!(ok, "{stderr}");
    // (high, low, bits, KL) of each row.
    let rows: Vec<(u8, u8, f64, f64)> = out
        .lines()
        .filter(|l| l.starts_with("| @"))
        .map(|l| {
            let c: Vec<&str> = l.split('|').map(str::trim).collect();
            let w = |s: &str| s.trim_start_matches('@').parse::<u8>().unwrap();
            (
                w(c[1]),
                w(c[2]),
                c[4].parse().unwrap(),
                c[5].parse().unwrap(),
            )
        })
        .collect();
    let pairs: Vec<(u8, u8)> = rows.iter().map(|r| (r.0, r.1)).collect();
    assert_eq!(pairs, [(8, 3), (6, 3), (4, 2), (5, 3)], "{out}");
    let budget = rows[3].2;
    let best = rows
        .iter()
        .filter(|r| r.2 <= budget)
        .min_by(|a, b| a.3.total_cmp(&b.3))
        .unwrap();
    let (h, l) = (format!("ap8@{}", best.0), format!("ap8@{}", best.1));
    assert!(
        out.contains(&format!("fitted widths: {h} high + {l} low")),
        "{out}"
    );
    let p = Platform::load(&profile).unwrap();
    assert_eq!((p.high_variant, p.low_variant), (Some(h), Some(l)));

    // The 8:3 row's KL, from perplexity's own comparison at the fitted thresholds.
    let t1 = number_after(&out, "fitted: T1 = ").to_string();
    let t2 = number_after(&out, ", T2 = ").to_string();
    let ppl = perplexity(
        &model,
        &text,
        &[
            "--expert-variant",
            "ap8",
            "--low",
            "ap8@3",
            "--t1",
            &t1,
            "--t2",
            &t2,
        ],
    );
    let kl = number_after(&ppl, "Mean KL(baseline || tested): ");
    assert!(
        (kl - rows[0].3).abs() <= 2e-3 * kl,
        "{kl} vs {}:\n{out}\n{ppl}",
        rows[0].3
    );
}

/// `--kl-divergence-base FILE` writes one run's logits, `--kl-divergence` compares another
/// process with them; `-b 1` scores through the decode path.
#[test]
fn kl_divergence_base_file_compares_two_runs() {
    let (dir, model) = convert_fixture("f16,int4");
    let text = text(dir.path());
    let base = dir.path().join("base.kld");
    let b = base.to_str().unwrap();
    let run = |extra: &[&str]| perplexity_stdout(&model, &text, 64, extra);

    let out = run(&["--kl-divergence-base", b]);
    assert!(base.exists(), "{out}");
    let ppl = number_after(&out, "Final estimate: PPL = ");
    // The same configuration in another process: the same logits, KL exactly 0, and the
    // baseline's perplexity is the written run's.
    let out = run(&["--kl-divergence-base", b, "--kl-divergence"]);
    assert_eq!(
        number_after(&out, "Mean KL(baseline || tested): "),
        0.0,
        "{out}"
    );
    assert_eq!(number_after(&out, "): PPL = "), ppl, "{out}");
    assert_eq!(number_after(&out, "Final estimate: PPL = "), ppl, "{out}");
    // Token by token through the decode path: the same model within rounding.
    let out = run(&["--kl-divergence-base", b, "--kl-divergence", "-b", "1"]);
    let kl = number_after(&out, "Mean KL(baseline || tested): ");
    assert!((0.0..1e-6).contains(&kl), "{out}");
    assert_eq!(number_after(&out, "Same top token: "), 100.0, "{out}");
    // Only the top-1 expert: a real divergence.
    let out = run(&[
        "--kl-divergence-base",
        b,
        "--kl-divergence",
        "--t1",
        "0",
        "--t2",
        "0",
    ]);
    assert!(
        number_after(&out, "Mean KL(baseline || tested): ") > 1e-4,
        "{out}"
    );

    // Another context size is refused by name, and the file is left as it was.
    let before = std::fs::read(&base).unwrap();
    let (ok, _, stderr) = perplexity_run(
        &model,
        &text,
        32,
        &["--kl-divergence-base", b, "--kl-divergence"],
    );
    assert!(
        !ok && stderr.contains("written with --ctx-size 64, this run has 32"),
        "{stderr}"
    );
    assert_eq!(std::fs::read(&base).unwrap(), before);
    // --kl-divergence needs the file.
    let (ok, _, stderr) = perplexity_run(&model, &text, 64, &["--kl-divergence"]);
    assert!(!ok && stderr.contains("--kl-divergence-base"), "{stderr}");
}

/// Issue 48: `hob calibrate -m small.hob -f text.txt` failed with "context full: 512 tokens
/// needed, the context holds 256" on a model whose context is 256: the default chunk is clamped
/// to the model's context, and the run says so. The same for `hob perplexity`.
#[test]
fn calibrate_and_perplexity_default_contexts_fit_a_model_of_256_tokens() {
    let (dir, model) = convert_fixture("f16");
    let m = model.to_str().unwrap();
    let short = text(dir.path());
    let (ok, _, stderr) = hob(&["calibrate", "-m", m, "-f", short.to_str().unwrap()]);
    assert!(ok, "{stderr}");
    let clamped = "-c/--ctx-size defaults to 512, beyond the model's context length: 256";
    assert!(stderr.contains(clamped), "{stderr}");
    let long = dir.path().join("long.txt");
    std::fs::write(&long, std::fs::read_to_string(&short).unwrap().repeat(3)).unwrap();
    let args = [
        "perplexity",
        "-m",
        m,
        "-f",
        long.to_str().unwrap(),
        "--chunks",
        "1",
    ];
    let (ok, out, stderr) = hob(&args);
    assert!(ok, "{stderr}");
    assert!(stderr.contains(clamped), "{stderr}");
    assert!(out.contains("Final estimate: PPL = "), "{out}");
}
