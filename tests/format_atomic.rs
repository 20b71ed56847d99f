//! The writer never leaves a half-written file: not when dropped, not when finish() fails, and
//! its contract violations and I/O errors name the file or the item.

mod format_support;

use format_support::{sample, write};
use hob::format::FormatError as Error;
use hob::format::{DType, DenseSpec, ExpertShape, HobWriter, Metadata, Variant};

fn entries(dir: &std::path::Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

#[test]
fn dropped_writer_leaves_no_file() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("m.hob");
    let s = sample(2);
    let mut w = HobWriter::create(&out, &s.metadata, &s.dense, s.shape, &s.variants).unwrap();
    assert_eq!(
        entries(dir.path()).len(),
        1,
        "the temporary file exists while writing"
    );
    w.write_dense(0, &s.dense_bytes[0]).unwrap();
    drop(w);
    assert!(entries(dir.path()).is_empty(), "{:?}", entries(dir.path()));
}

#[test]
fn finish_with_a_missing_item_names_it_and_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("m.hob");
    let s = sample(2);
    let mut w = HobWriter::create(&out, &s.metadata, &s.dense, s.shape, &s.variants).unwrap();
    for (i, b) in s.dense_bytes.iter().enumerate() {
        w.write_dense(i, b).unwrap();
    }
    let nv = s.variants.len();
    for (i, b) in s.blobs.iter().enumerate() {
        if i != (4 * nv) + 3 {
            w.write_expert(i / nv / 3, i / nv % 3, i % nv, b).unwrap();
        }
    }
    match w.finish() {
        Err(Error::Request(msg)) => {
            assert!(
                msg.contains("expert (layer 1, expert 1, variant int2/g32) was never written"),
                "{msg}"
            )
        }
        r => panic!("{r:?}"),
    }
    assert!(entries(dir.path()).is_empty());

    let mut w = HobWriter::create(&out, &s.metadata, &s.dense, s.shape, &s.variants).unwrap();
    w.write_dense(0, &s.dense_bytes[0]).unwrap();
    let msg = w.finish().unwrap_err().to_string();
    assert!(
        msg.contains("tensor 'blk.0.attn_q.weight' was never written"),
        "{msg}"
    );
    assert!(entries(dir.path()).is_empty());
}

#[test]
fn create_in_a_missing_or_unwritable_directory_names_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let s = sample(2);
    let out = dir.path().join("no/such/dir/m.hob");
    match HobWriter::create(&out, &s.metadata, &s.dense, s.shape, &s.variants) {
        Err(Error::Io { path, op, source }) => {
            assert!(
                path.starts_with(dir.path().join("no/such/dir")),
                "{}",
                path.display()
            );
            assert_eq!(op, "create");
            assert_eq!(source.kind(), std::io::ErrorKind::NotFound);
        }
        r => panic!("{:?}", r.err()),
    }
    // Root ignores permissions, so unwritability is shown with a path under a regular file.
    let file = dir.path().join("plain");
    std::fs::write(&file, b"x").unwrap();
    let err = HobWriter::create(
        &file.join("m.hob"),
        &s.metadata,
        &s.dense,
        s.shape,
        &s.variants,
    )
    .err()
    .unwrap();
    assert!(matches!(err, Error::Io { .. }), "{err}");
    assert!(err.to_string().contains("plain/m.hob"), "{err}");
}

#[test]
fn a_finished_file_replaces_the_old_one_atomically() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("m.hob");
    std::fs::write(&out, b"old").unwrap();
    write(&sample(4), &out).unwrap();
    assert_eq!(entries(dir.path()), ["m.hob"]);
    hob::format::HobFile::open(&out).unwrap().verify().unwrap();
}

#[test]
fn contract_violations_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("m.hob");
    let m = Metadata::new();
    let shape = ExpertShape {
        n_layers: 1,
        n_experts: 2,
        hidden: 64,
        ffn: 128,
    };
    let int4 = Variant::parse("int4", None).unwrap();
    let dense = |name: &str, shape: Vec<usize>| DenseSpec {
        name: name.into(),
        dtype: DType::F16.into(),
        shape,
    };
    let cases: Vec<(Vec<DenseSpec>, ExpertShape, Vec<Variant>, &str)> = vec![
        (vec![dense("", vec![4])], shape, vec![int4], "empty name"),
        (
            vec![dense("a", vec![4]), dense("a", vec![2])],
            shape,
            vec![int4],
            "'a' given twice",
        ),
        (
            vec![dense("a", vec![2, 2, 2])],
            shape,
            vec![int4],
            "1 or 2 non-zero dims",
        ),
        (
            vec![dense("a", vec![0])],
            shape,
            vec![int4],
            "1 or 2 non-zero dims",
        ),
        (vec![], shape, vec![], "at least one variant"),
        (vec![], shape, vec![int4, int4], "given twice"),
        (
            vec![],
            ExpertShape {
                hidden: 96,
                ..shape
            },
            vec![int4],
            "not a multiple of the group size",
        ),
        (
            vec![],
            shape,
            vec![Variant {
                group_size: 10,
                ..int4
            }],
            "group size",
        ),
    ];
    for (d, sh, v, want) in cases {
        match HobWriter::create(&out, &m, &d, sh, &v) {
            Err(Error::Request(msg)) => assert!(msg.contains(want), "{msg} !~ {want}"),
            r => panic!("{want}: {:?}", r.err()),
        }
    }
    let mut bad = Metadata::new();
    bad.set(
        "k",
        hob::format::MetaValue::Array {
            elem_type: 4,
            items: vec![hob::format::MetaValue::I32(1)],
        },
    );
    let err = HobWriter::create(&out, &bad, &[], shape, &[int4])
        .err()
        .unwrap();
    assert!(
        err.to_string().contains("array of u32 holds a i32"),
        "{err}"
    );

    let mut w = HobWriter::create(&out, &m, &[dense("a", vec![4])], shape, &[int4]).unwrap();
    assert!(w
        .write_dense(0, &[0; 7])
        .unwrap_err()
        .to_string()
        .contains("expected 8 bytes, got 7"));
    w.write_dense(0, &[0; 8]).unwrap();
    assert!(w
        .write_dense(0, &[0; 8])
        .unwrap_err()
        .to_string()
        .contains("written twice"));
    assert!(w
        .write_dense(1, &[0; 8])
        .unwrap_err()
        .to_string()
        .contains("out of range"));
    assert!(w
        .write_expert(1, 0, 0, &[])
        .unwrap_err()
        .to_string()
        .contains("out of range"));
    drop(w);
    assert!(entries(dir.path()).is_empty());
}

#[test]
fn a_model_without_experts_is_valid() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("dense.hob");
    let shape = ExpertShape {
        n_layers: 0,
        n_experts: 0,
        hidden: 0,
        ffn: 0,
    };
    let d = DenseSpec {
        name: "w".into(),
        dtype: DType::F32.into(),
        shape: vec![3],
    };
    let mut w = HobWriter::create(&out, &Metadata::new(), &[d], shape, &[]).unwrap();
    w.write_dense(0, &[1; 12]).unwrap();
    w.finish().unwrap();
    let f = hob::format::HobFile::open(&out).unwrap();
    assert_eq!(
        (
            f.n_layers(),
            f.variants().len(),
            f.tensor("w").unwrap().data
        ),
        (0, 0, &[1u8; 12][..])
    );
    f.verify().unwrap();
}

/// Issue 49, item 8: temporary files of killed writers were never removed. Only `<out>.tmp-<pid>`
/// files of `out` whose process is gone are; a live process's file and other names stay.
#[test]
fn stale_temp_files_of_dead_processes_are_removed() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("m.hob");
    let mut child = std::process::Command::new("true").spawn().unwrap();
    child.wait().unwrap();
    let dead = child.id();
    let live = std::process::id();
    for name in [
        format!("m.hob.tmp-{dead}"),
        format!("m.hob.tmp-{live}"),
        format!("m.hob.tmp-{dead}x"),
        format!("other.hob.tmp-{dead}"),
        "m.hob".to_string(),
    ] {
        std::fs::write(dir.path().join(name), b"x").unwrap();
    }
    std::fs::create_dir(dir.path().join(format!("m.hob.tmp-{}", dead + 1))).ok();
    let removed = hob::format::writer::remove_stale_temp_files(&out).unwrap();
    assert_eq!(
        removed,
        [(dir.path().join(format!("m.hob.tmp-{dead}")), dead as i32)]
    );
    let left = entries(dir.path());
    assert_eq!(left.len(), 5, "{left:?}");
    assert!(!left.contains(&format!("m.hob.tmp-{dead}")), "{left:?}");
    // Nothing to do where the directory has no such files; a missing directory is named.
    assert!(hob::format::writer::remove_stale_temp_files(&out)
        .unwrap()
        .is_empty());
    let err = hob::format::writer::remove_stale_temp_files(&dir.path().join("no/m.hob"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("no: list directory"), "{err}");
}
