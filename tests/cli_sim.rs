//! `hob sim` through the binary: a hand-written trace, the table's numbers (hand-computed in
//! experts::cache's unit test of the same trace), JSON output, and malformed-trace errors.

mod common;

use std::path::Path;
use std::process::Output;

fn hob(args: &[&str]) -> Output {
    common::hob_command().args(args).output().unwrap()
}

/// 2 layers x 4 experts, top-2, f16 4 bytes / int4 1 byte; two sequences.
const TRACE: &str = r#"{"hob_trace":1,"model":"tiny","layers":2,"experts":4,"top_k":2,"high":"f16","low":"int4","high_bytes":4,"low_bytes":1,"t1":0.6,"t2":0.9}
{"seq":0,"tok":0,"layer":0,"routes":[[0,0.7,"high"],[1,0.3,"low"]]}
{"seq":0,"tok":0,"layer":1,"routes":[[2,0.8,"high"],[3,0.2,"skip"]]}
{"seq":0,"tok":1,"layer":0,"routes":[[0,0.6,"high"],[1,0.4,"high"]]}
{"seq":0,"tok":1,"layer":1,"routes":[[2,0.5,"high"],[0,0.5,"low"]]}
{"seq":1,"tok":0,"layer":0,"routes":[[1,0.9,"high"],[0,0.1,"low"]]}
"#;

fn write(dir: &Path, name: &str, text: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p.to_str().unwrap().to_string()
}

fn stdout_of(args: &[&str]) -> String {
    let out = hob(args);
    let (so, se) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert!(out.status.success(), "hob {args:?} failed:\n{so}\n{se}");
    so
}

/// The cells of the table row of `policy`.
fn row(table: &str, policy: &str) -> Vec<String> {
    let line = table
        .lines()
        .find(|l| l.starts_with(&format!("| {policy} ")))
        .unwrap_or_else(|| panic!("no row {policy} in\n{table}"));
    line.split('|')
        .map(|c| c.trim().to_string())
        .filter(|c| !c.is_empty())
        .collect()
}

#[test]
fn table_of_penalties() {
    let dir = tempfile::tempdir().unwrap();
    let t = write(dir.path(), "t.jsonl", TRACE);
    let out = stdout_of(&[
        "sim",
        "--trace",
        &t,
        "--high-slots",
        "2,0",
        "--low-slots",
        "1,0",
        "--policies",
        "lru,lfu,hobbit",
        "--cache-weights",
        "0.4,0.2,0.3,0.1",
    ]);
    assert!(out.contains("3 tokens in 2 sequences"), "{out}");
    assert!(out.contains("routes: 9 computed, 1 skipped"), "{out}");
    assert_eq!(
        row(&out, "policy"),
        ["policy", "2 high + 1 low", "0 high + 0 low"]
    );
    // 4 high misses + 3 low misses x 1/4; 2 hits of 9 computed routes. No cache: 6 + 3/4.
    assert_eq!(
        row(&out, "lru"),
        ["lru", "4.75 (22.2% hit)", "6.75 (0.0% hit)"]
    );
    let lfu = row(&out, "lfu");
    assert_eq!(lfu.len(), 3);
    assert!(lfu[2] == "6.75 (0.0% hit, +0.0%)", "{lfu:?}");
    // Hobbit (weights 0.4/0.2/0.3/0.1) keeps (0,0) over (0,1) at token 1 layer 1 (more high
    // uses), so the next sequence's top-1 (0,1) misses while its low route (0,0) runs from the
    // cached high copy: 5 high misses + 2 low misses x 1/4; 2 hits.
    assert_eq!(row(&out, "hobbit")[1], "5.50 (22.2% hit, +15.8%)");

    let out = stdout_of(&[
        "sim",
        "--trace",
        &t,
        "--high-slots",
        "2",
        "--low-slots",
        "1",
        "--policies",
        "lru",
        "--substitute-low",
    ]);
    // As the unit test: the last low route runs from its cached high copy.
    assert_eq!(row(&out, "lru"), ["lru", "3.50 (44.4% hit)"]);

    // Budget fractions: all experts at f16 = 2 x 4 x 4 = 32 bytes; 50% = 16. The default share
    // (0.05: 0.8 bytes) buys no int4 slot by itself, but one is kept: 1 int4 + 3 f16.
    let out = stdout_of(&["sim", "--trace", &t, "--cache-frac", "0.5"]);
    assert_eq!(row(&out, "policy"), ["policy", "50%: 3 high + 1 low"]);
    // A quarter (4 bytes) buys 4 int4 slots, the other 12 three f16 slots.
    let out = stdout_of(&[
        "sim",
        "--trace",
        &t,
        "--cache-frac",
        "0.5",
        "--low-share",
        "0.25",
        "--fit",
    ]);
    assert_eq!(row(&out, "policy"), ["policy", "50%: 3 high + 4 low"]);
    for p in [
        "lru",
        "lfu",
        "lhu",
        "fld",
        "fld-back",
        "hobbit",
        "hobbit-back",
    ] {
        row(&out, p);
    }
    assert!(out.contains("best --cache-weights"), "{out}");
}

#[test]
fn json_output() {
    let dir = tempfile::tempdir().unwrap();
    let t = write(dir.path(), "t.jsonl", TRACE);
    let out = stdout_of(&[
        "sim",
        "--trace",
        &t,
        "--high-slots",
        "2",
        "--low-slots",
        "1",
        "--policies",
        "lru,fld",
        "-o",
        "json",
    ]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let lru = &v["rows"][0]["cells"][0];
    assert_eq!(v["rows"][0]["policy"], "lru");
    assert_eq!(lru["high_misses"], 4);
    assert_eq!(lru["low_misses"], 3);
    assert_eq!(lru["penalty"], 4.75);
    assert_eq!(v["columns"][0]["high_slots"], 2);
    assert_eq!(v["rows"][1]["config"], "hobbit(0,0,0,1)");
    assert_eq!(v["tokens"], 3);
    assert_eq!(lru["low_cached_misses"], 1);
}

/// Issue 54: a trace of two widths of one ap8 blob prices a high miss whose low copy is cached
/// at the missing planes (1 - low / high of a load), and says so.
#[test]
fn nested_ap8_widths_price_low_cached_high_misses_at_their_missing_planes() {
    let dir = tempfile::tempdir().unwrap();
    let nested = TRACE.replacen(
        r#""high":"f16","low":"int4""#,
        r#""high":"ap8@5","low":"ap8@3""#,
        1,
    );
    let t = write(dir.path(), "t.jsonl", &nested);
    let args = [
        "sim",
        "--trace",
        &t,
        "--high-slots",
        "2",
        "--low-slots",
        "1",
    ];
    let out = stdout_of(&[&args[..], &["--policies", "lru"]].concat());
    assert!(
        out.contains("ap8@5 and ap8@3 are widths of one ap8 blob")
            && out.contains("(0.750 of a high load)"),
        "{out}"
    );
    // The unit test's trace: 4.75, less a quarter for the one high miss with its low copy cached.
    assert_eq!(row(&out, "lru"), ["lru", "4.50 (22.2% hit)"]);
}

#[test]
fn bad_traces_and_flags_fail_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let fail = |args: &[&str]| {
        let out = hob(args);
        assert!(!out.status.success(), "hob {args:?} succeeded");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    // Line 3 names expert 9 of 4.
    let bad = TRACE.replacen("[[2,0.8,", "[[9,0.8,", 1);
    let t = write(dir.path(), "bad.jsonl", &bad);
    let e = fail(&["sim", "--trace", &t]);
    assert!(e.contains("bad.jsonl:3: expert 9 >= experts 4"), "{e}");
    // A truncated last line.
    let cut = &TRACE[..TRACE.len() - 20];
    let t = write(dir.path(), "cut.jsonl", cut);
    let e = fail(&["sim", "--trace", &t]);
    assert!(e.contains("cut.jsonl:6: bad record"), "{e}");
    let t = write(dir.path(), "t.jsonl", TRACE);
    let e = fail(&["sim", "--trace", &t, "--policies", "lru,arc"]);
    assert!(e.contains("arc"), "{e}");
    let e = fail(&["sim", "--trace", &t, "--cache-weights", "0.5,0.5,0.5,0.5"]);
    assert!(e.contains("--cache-weights"), "{e}");
    let e = fail(&["sim", "--trace", &t, "--cache-frac", "0"]);
    assert!(e.contains("--cache-frac"), "{e}");
    let e = fail(&["sim", "--trace", &t, "--low-share", "2"]);
    assert!(e.contains("--low-share"), "{e}");
    let e = fail(&[
        "sim",
        "--trace",
        dir.path().join("none.jsonl").to_str().unwrap(),
    ]);
    assert!(e.contains("none.jsonl"), "{e}");
}
