//! The slow tier end to end: expert blobs of a real .hob file loaded chunk by chunk on the
//! scheduler thread through the best reader this machine allows, into page-aligned host memory.

mod format_support;
#[path = "common/paths.rs"]
mod paths;

use std::collections::hash_map::{Entry, HashMap};

use format_support::{sample, write};
use hob::experts::io::{open_reader, AlignedBuf, BlobSource, DIRECT_ALIGN};
use hob::experts::{Priority, Scheduler, Worker};
use hob::format::HobFile;

/// One blob to load: its key and where it lies.
#[derive(Clone, Copy, Debug)]
struct Load {
    key: (usize, usize, usize),
    offset: u64,
    padded: usize,
}

/// Reads a blob `CHUNK` bytes at a time into a staging buffer; completion hands the buffer over.
struct BlobLoader {
    reader: Box<dyn BlobSource>,
    staging: HashMap<(usize, usize, usize), AlignedBuf>,
}

const CHUNK: usize = 2 * DIRECT_ALIGN;

impl Worker for BlobLoader {
    type Job = Load;
    type Done = AlignedBuf;
    fn chunks(&mut self, job: &Load) -> usize {
        job.padded.div_ceil(CHUNK)
    }
    fn run_chunk(&mut self, job: &Load, i: usize) -> hob::Result<()> {
        let buf = match self.staging.entry(job.key) {
            Entry::Occupied(o) => o.into_mut(),
            Entry::Vacant(v) => v.insert(AlignedBuf::new(job.padded)?),
        }
        .as_mut_slice();
        let range = i * CHUNK..((i + 1) * CHUNK).min(job.padded);
        self.reader
            .read_into(job.offset + (i * CHUNK) as u64, &mut buf[range])
    }
    fn complete(&mut self, job: &Load) -> hob::Result<AlignedBuf> {
        self.staging
            .remove(&job.key)
            .ok_or_else(|| hob::Error::Invalid(format!("{:?}: no staging buffer", job.key)))
    }
}

#[test]
fn every_blob_loads_through_the_scheduler_byte_exact() {
    let dir = tempfile::tempdir_in(paths::tmp_root()).unwrap();
    let path = dir.path().join("m.hob");
    let s = sample(7);
    write(&s, &path).unwrap();
    let f = HobFile::open(&path).unwrap();
    let nv = f.variants().len();

    let mut loads = Vec::new();
    for l in 0..f.n_layers() {
        for e in 0..f.n_experts() {
            for v in 0..nv {
                let (offset, padded) = f.expert_span(l, e, v);
                let size = f.expert_record(l, e, v).size;
                assert_eq!(offset, f.expert_record(l, e, v).offset);
                assert_eq!((offset % 4096, padded % 4096), (0, 0));
                assert!(padded >= size && padded - size < 4096);
                loads.push(Load {
                    key: (l, e, v),
                    offset,
                    padded: padded as usize,
                });
            }
        }
    }

    let reader = open_reader(&path, true).unwrap();
    eprintln!("reader: {}", reader.reader_kind());
    let sched = Scheduler::spawn(BlobLoader {
        reader,
        staging: HashMap::new(),
    })
    .unwrap();
    let tickets: Vec<_> = loads
        .iter()
        .enumerate()
        .map(|(i, &load)| {
            let p = if i % 3 == 0 {
                Priority::Demand
            } else {
                Priority::Prefetch
            };
            (load, sched.submit(load, p).unwrap())
        })
        .collect();

    for (load, t) in tickets {
        let (l, e, v) = load.key;
        let buf = t.wait().unwrap();
        let blob = f.expert(l, e, v).data;
        assert_eq!(&buf.as_slice()[..blob.len()], blob, "{:?}", load.key);
        assert!(buf.as_slice()[blob.len()..].iter().all(|&b| b == 0));
        assert_eq!(
            crc32c::crc32c(&buf.as_slice()[..blob.len()]),
            f.expert_record(l, e, v).crc32c
        );
    }
    sched.shutdown().unwrap();
}
