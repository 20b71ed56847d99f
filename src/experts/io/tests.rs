//! Tests of io.rs.

use super::*;
use std::io::Write;
use std::sync::{Mutex, OnceLock};

const FILE_LEN: usize = 3 * (1 << 20) + 5 * DIRECT_ALIGN;

fn byte_at(i: usize) -> u8 {
    ((i as u64).wrapping_mul(2_654_435_761) >> 11) as u8
}

/// Directories to test in: the system temp dir (may be tmpfs) and one under the checkout's
/// target/ (a real filesystem as a rule); the checkout is the current directory when it is
/// one (cargo's, or the device's after tools/stage_gpu.sh), else the one built from.
fn test_dirs() -> Vec<PathBuf> {
    let is_checkout = |dir: &Path| {
        std::fs::read_to_string(dir.join("Cargo.toml"))
            .is_ok_and(|toml| toml.lines().any(|l| l.trim() == r#"name = "hob""#))
    };
    let root = std::env::current_dir()
        .ok()
        .filter(|dir| is_checkout(dir))
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")));
    let target = root.join("target/io-test-tmp");
    let mut dirs = vec![std::env::temp_dir()];
    if std::fs::create_dir_all(&target).is_ok() {
        dirs.push(target);
    }
    dirs
}

fn known_file(dir: &Path) -> tempfile::NamedTempFile {
    let mut f = tempfile::NamedTempFile::new_in(dir).unwrap();
    let bytes: Vec<u8> = (0..FILE_LEN).map(byte_at).collect();
    f.write_all(&bytes).unwrap();
    f.flush().unwrap();
    f
}

struct Rng(u64);
impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// Random aligned (offset, len) inside the file.
fn aligned_range(rng: &mut Rng) -> (u64, usize) {
    let pages = (FILE_LEN / DIRECT_ALIGN) as u64;
    let first = rng.below(pages);
    let n = 1 + rng.below((pages - first).min(600));
    (first * DIRECT_ALIGN as u64, n as usize * DIRECT_ALIGN)
}

fn assert_bytes(got: &[u8], offset: u64, what: &str) {
    for (k, &b) in got.iter().enumerate() {
        let i = offset as usize + k;
        assert_eq!(b, byte_at(i), "{what}: byte {i}");
    }
}

/// Every reader this machine allows on `path`, with the reason for each one it refused.
fn readers(path: &Path) -> (Vec<Box<dyn BlobSource>>, Vec<String>) {
    let mut ok: Vec<Box<dyn BlobSource>> = Vec::new();
    let mut refused = Vec::new();
    let mut keep = |r: Result<Box<dyn BlobSource>>, what: &str| match r {
        Ok(r) => ok.push(r),
        Err(e) => refused.push(format!("{what}: {e}")),
    };
    #[cfg(target_os = "linux")]
    {
        keep(
            UringReader::open(path).map(|r| Box::new(r) as _),
            "io_uring default",
        );
        let small = UringOptions {
            depth: 4,
            chunk_bytes: 2 * DIRECT_ALIGN,
        };
        keep(
            UringReader::with_options(path, small).map(|r| Box::new(r) as _),
            "io_uring depth 4, 8 KiB requests",
        );
    }
    keep(
        PreadReader::open(path, true).map(|r| Box::new(r) as _),
        "pread O_DIRECT",
    );
    keep(
        PreadReader::open(path, false).map(|r| Box::new(r) as _),
        "pread",
    );
    keep(open_reader(path, true), "open_reader(direct)");
    keep(open_reader(path, false), "open_reader(buffered)");
    (ok, refused)
}

#[test]
fn every_reader_returns_the_file_bytes() {
    for dir in test_dirs() {
        let f = known_file(&dir);
        let (rs, refused) = readers(f.path());
        eprintln!(
            "{}: readers {:?}; refused {refused:?}",
            dir.display(),
            rs.iter().map(|r| r.reader_kind()).collect::<Vec<_>>()
        );
        // Buffered pread works everywhere, and open_reader always gives a reader.
        assert!(rs.len() >= 3, "{refused:?}");
        for refusal in &refused {
            // Only the direct paths may be refused, and only by the kernel or filesystem.
            assert!(
                refusal.contains("O_DIRECT") || refusal.contains("io_uring"),
                "{refusal}"
            );
        }
        for mut r in rs {
            let kind = r.reader_kind();
            let mut rng = Rng(0x2545_f491_4f6c_dd1d);
            for _ in 0..25 {
                let (offset, len) = aligned_range(&mut rng);
                let mut buf = AlignedBuf::new(len).unwrap();
                r.read_into(offset, buf.as_mut_slice()).unwrap();
                assert_bytes(buf.as_slice(), offset, kind);
            }
            // A batch of several ranges, kept in flight together by io_uring.
            let ranges: Vec<_> = (0..6).map(|_| aligned_range(&mut rng)).collect();
            let mut bufs: Vec<_> = ranges
                .iter()
                .map(|&(_, len)| AlignedBuf::new(len).unwrap())
                .collect();
            let mut reqs: Vec<(u64, &mut [u8])> = ranges
                .iter()
                .zip(bufs.iter_mut())
                .map(|(&(o, _), b)| (o, b.as_mut_slice()))
                .collect();
            r.read_batch(&mut reqs).unwrap();
            for ((o, _), b) in ranges.iter().zip(&bufs) {
                assert_bytes(b.as_slice(), *o, kind);
            }
            // The whole file in one read.
            let mut all = AlignedBuf::new(FILE_LEN).unwrap();
            r.read_into(0, all.as_mut_slice()).unwrap();
            assert_bytes(all.as_slice(), 0, kind);
        }
    }
}

#[test]
fn misaligned_direct_reads_are_refused_with_a_clear_error() {
    for dir in test_dirs() {
        let f = known_file(&dir);
        let (rs, _) = readers(f.path());
        for mut r in rs {
            let kind = r.reader_kind();
            let mut buf = AlignedBuf::new(4 * DIRECT_ALIGN).unwrap();
            let cases: [(u64, std::ops::Range<usize>); 3] = [
                (100, 0..DIRECT_ALIGN),
                (4096, 0..1000),
                (8192, 512..512 + DIRECT_ALIGN),
            ];
            for (offset, range) in cases {
                let dst = &mut buf.as_mut_slice()[range.clone()];
                let res = r.read_into(offset, dst);
                if r.alignment() == 1 {
                    res.unwrap();
                    assert_bytes(&buf.as_slice()[range], offset, kind);
                    continue;
                }
                let e = res.unwrap_err().to_string();
                assert!(
                    e.contains("aligned to 4096")
                        && e.contains(&format!("offset {offset}"))
                        && e.contains(&f.path().display().to_string()),
                    "{kind}: {e}"
                );
            }
        }
    }
}

/// Issue 55, faults: the file shrinks under every reader (io_uring, O_DIRECT, buffered pread)
/// after it was opened: a read across the new end is a short read, reported as the file ending
/// early with the path and offset, never bytes of garbage; reads before the end still work.
#[test]
fn a_file_that_shrinks_under_any_reader_is_a_clear_error() {
    for dir in test_dirs() {
        let f = known_file(&dir);
        let (rs, _) = readers(f.path());
        let keep = (FILE_LEN / 2) as u64 & !(DIRECT_ALIGN as u64 - 1);
        f.as_file().set_len(keep).unwrap();
        for mut r in rs {
            let kind = r.reader_kind();
            let mut buf = AlignedBuf::new(4 * DIRECT_ALIGN).unwrap();
            let offset = keep - 2 * DIRECT_ALIGN as u64;
            let msg = r
                .read_into(offset, buf.as_mut_slice())
                .unwrap_err()
                .to_string();
            assert!(
                msg.contains(&f.path().display().to_string())
                    && msg.contains("the file ended early")
                    && msg.contains(&format!("offset {keep}")),
                "{kind}: {msg}"
            );
            let mut one = AlignedBuf::new(DIRECT_ALIGN).unwrap();
            r.read_into(offset, one.as_mut_slice()).unwrap();
            assert_bytes(one.as_slice(), offset, kind);
        }
    }
}

#[test]
fn reads_past_the_end_name_the_offset() {
    let dir = &test_dirs()[0];
    let f = known_file(dir);
    let (rs, _) = readers(f.path());
    for mut r in rs {
        let offset = (FILE_LEN - DIRECT_ALIGN) as u64;
        let mut buf = AlignedBuf::new(2 * DIRECT_ALIGN).unwrap();
        let e = r.read_into(offset, buf.as_mut_slice()).unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains(&format!("offset {offset}")) && msg.contains("past the end"),
            "{}: {msg}",
            r.reader_kind()
        );
        let mut one = AlignedBuf::new(DIRECT_ALIGN).unwrap();
        assert!(r.read_into(FILE_LEN as u64, one.as_mut_slice()).is_err());
        assert!(r.read_into(u64::MAX - 4095, one.as_mut_slice()).is_err());
        // The reader still works afterwards.
        r.read_into(offset, one.as_mut_slice()).unwrap();
        assert_bytes(one.as_slice(), offset, r.reader_kind());
    }
}

#[test]
fn fallbacks_are_taken_in_order_and_say_why() {
    let dir = test_dirs().pop().unwrap();
    let f = known_file(&dir);
    let mut warnings = Vec::new();
    let mut warn = |m: &str| warnings.push(m.to_string());
    let direct_ok = PreadReader::open(f.path(), true).is_ok();

    let r = open_reader_with(
        f.path(),
        true,
        Refuse {
            uring: true,
            direct: false,
        },
        &mut warn,
    )
    .unwrap();
    if direct_ok {
        assert_eq!(r.reader_kind(), "pread+O_DIRECT");
    }
    let r = open_reader_with(
        f.path(),
        true,
        Refuse {
            uring: true,
            direct: true,
        },
        &mut warn,
    )
    .unwrap();
    assert_eq!(r.reader_kind(), "pread");
    assert_eq!(r.alignment(), 1);
    let w = warnings.clone();
    assert!(w.len() >= 3, "{w:?}");
    assert!(
        w[0].contains("io_uring") && w[0].contains("refused"),
        "{w:?}"
    );
    let last = &w[w.len() - 1];
    assert!(
        last.contains("O_DIRECT refused") && last.contains("buffered pread"),
        "{w:?}"
    );
    assert!(w
        .iter()
        .all(|m| m.contains(&f.path().display().to_string())));

    // No direct I/O asked: buffered at once, nothing to warn about.
    warnings.clear();
    let r = open_reader_with(f.path(), false, Refuse::default(), &mut |m: &str| {
        warnings.push(m.to_string())
    })
    .unwrap();
    assert_eq!(r.reader_kind(), "pread");
    assert!(warnings.is_empty());
    // A missing file is an error, not a fallback.
    let e = open_reader(&dir.join("no-such-file.hob"), true)
        .err()
        .unwrap();
    assert!(e.to_string().contains("no-such-file.hob"), "{e}");
}

/// Captures log lines for the test below.
struct Capture(Mutex<Vec<String>>);
impl log::Log for Capture {
    fn enabled(&self, _: &log::Metadata) -> bool {
        true
    }
    fn log(&self, record: &log::Record) {
        if let Ok(mut v) = self.0.lock() {
            v.push(format!("{} {}", record.level(), record.args()));
        }
    }
    fn flush(&self) {}
}

fn capture() -> Option<&'static Capture> {
    static CAPTURE: OnceLock<Option<&'static Capture>> = OnceLock::new();
    *CAPTURE.get_or_init(|| {
        let c: &'static Capture = Box::leak(Box::new(Capture(Mutex::new(Vec::new()))));
        log::set_logger(c).ok()?;
        log::set_max_level(log::LevelFilter::Warn);
        Some(c)
    })
}

/// tmpfs: older kernels refuse O_DIRECT there (EINVAL), Linux 6.6+ accepts it. Either way
/// open_reader gives a working reader, and a fallback is logged.
#[test]
fn tmpfs_gets_a_working_reader_and_any_fallback_is_logged() {
    let shm = Path::new("/dev/shm");
    if !shm.is_dir() {
        eprintln!("skipped: no /dev/shm");
        return;
    }
    let Some(logs) = capture() else {
        eprintln!("skipped: another logger is installed");
        return;
    };
    let f = known_file(shm);
    let direct_ok = PreadReader::open(f.path(), true).is_ok();
    let mut r = open_reader(f.path(), true).unwrap();
    let name = f.path().display().to_string();
    let mine: Vec<String> = logs
        .0
        .lock()
        .unwrap()
        .iter()
        .filter(|l| l.contains(&name))
        .cloned()
        .collect();
    eprintln!(
        "tmpfs: O_DIRECT accepted: {direct_ok}; reader {}; log {mine:?}",
        r.reader_kind()
    );
    if direct_ok {
        assert_ne!(r.reader_kind(), "pread");
    } else {
        assert_eq!(r.reader_kind(), "pread");
        assert!(
            mine.iter()
                .any(|l| l.starts_with("WARN") && l.contains("falling back to buffered")),
            "{mine:?}"
        );
    }
    if r.reader_kind() != "io_uring+O_DIRECT" {
        assert!(mine.iter().any(|l| l.contains("io_uring")), "{mine:?}");
    }
    let mut buf = AlignedBuf::new(64 * DIRECT_ALIGN).unwrap();
    r.read_into(8 * DIRECT_ALIGN as u64, buf.as_mut_slice())
        .unwrap();
    assert_bytes(buf.as_slice(), 8 * DIRECT_ALIGN as u64, r.reader_kind());
}

#[test]
fn aligned_buffers_are_page_aligned() {
    for len in [0, 1, 4095, 4096, 4097, 3 << 20] {
        let mut b = AlignedBuf::new(len).unwrap();
        assert_eq!(b.len(), len);
        assert_eq!(b.as_slice().as_ptr() as usize % DIRECT_ALIGN, 0);
        assert!(b.as_slice().iter().all(|&x| x == 0));
        b.as_mut_slice().fill(7);
        assert!(b.as_slice().iter().all(|&x| x == 7));
    }
}
