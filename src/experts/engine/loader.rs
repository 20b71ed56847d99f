//! The loader thread's worker: a load job copies one file range (an expert blob, or one of its
//! matrices) into a slot, in chunks of 16 MiB so that a demand load overtakes a prefetch
//! between two of them (experts::scheduler). Bytes come from the page cache or the SSD; the
//! device's copier moves them (by DMA from page-locked file pages, through staging, or into
//! mapped host slots); an emulated link or SSD paces them.

use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use memmap2::Mmap;
use rayon::prelude::*;

use crate::experts::io::BlobSource;
use crate::experts::scheduler::{Ticket, Worker};
use crate::format::{crc32c_pieces, BlobChecks};
use crate::model::{ChunkCopier, DeviceEvent};
use crate::Error;

/// Bytes a chunk carries at most.
pub const CHUNK: usize = 16 << 20;
/// Chunks a demand load may queue behind on the link (the copier keeps this many in flight).
pub const CHUNKS_IN_FLIGHT: usize = 4;
/// Threads copying out of the page cache: enough to outrun a 25 GB/s link, the other cores left
/// to CPU experts.
const FILL_THREADS: usize = 8;
/// Bytes of a blob one fill thread checksums at a time.
const CRC_PIECE: usize = 1 << 20;
/// Lateness of a paced chunk still counted as back to back with the previous one (a sleep's
/// overshoot, not an idle link).
const PACE_SLACK: Duration = Duration::from_micros(500);

/// Bytes a load takes from another slot before its file bytes: a narrower copy of the same ap8
/// blob (format::ap8: width k is a prefix), whose missing planes the file bytes then add.
#[derive(Clone, Copy, Debug)]
pub struct SlotCopy {
    pub from: u64,
    pub to: u64,
    pub len: usize,
}

/// One load: file bytes `src` to `dst` (a device address, or a host address of a mapped arena),
/// after `prefix` where it is set.
pub struct LoadJob<E> {
    pub src: Range<usize>,
    pub dst: u64,
    pub mapped: bool,
    pub prefix: Option<SlotCopy>,
    /// Compute that may still read the destination's previous contents.
    pub after: E,
    /// Set by the engine to drop the rest of a prefetch proven wrong: the job's next chunk
    /// fails it with [`Error::Cancelled`] instead of running.
    pub abort: Option<Arc<AtomicBool>>,
}

impl<E> LoadJob<E> {
    fn chunks(&self) -> usize {
        self.src.len().div_ceil(CHUNK)
    }

    /// Chunk `i`: (file range, destination).
    fn chunk(&self, i: usize) -> (Range<usize>, u64) {
        let at = i * CHUNK;
        let len = CHUNK.min(self.src.len() - at);
        let start = self.src.start + at;
        (start..start + len, self.dst + at as u64)
    }
}

/// Bytes and time the loader has spent, shared with the engine.
#[derive(Default)]
pub struct LoadCounters {
    pub bytes: AtomicU64,
    pub disk_bytes: AtomicU64,
    pub nanos: AtomicU64,
}

/// A load's completion: the event after its last copy (None for a mapped arena: the host wrote
/// it, and the job returned once done).
pub type Done<E> = Option<E>;

/// Whether a load has landed: its job ran and its last copy finished.
pub fn landed<E: DeviceEvent>(t: &Ticket<Done<E>>) -> bool {
    t.peek(|r| !matches!(r, Ok(Some(ev)) if !ev.is_complete()))
        .unwrap_or(false)
}

/// The loader thread's state.
pub struct Loader<C: ChunkCopier> {
    copier: C,
    map: Arc<Mmap>,
    /// Direct copies from the page-locked file (else staging, or mapped arenas).
    direct: bool,
    /// The emulated link paced on the host (staged and mapped loads), bytes per second, and when
    /// it has carried every chunk handed to it so far.
    pace: Option<f64>,
    link_free: Instant,
    disk: Option<Box<dyn BlobSource>>,
    counters: Arc<LoadCounters>,
    fill_pool: rayon::ThreadPool,
    /// The file's blob checksums: a blob's is checked beside its first load.
    checks: Option<Arc<BlobChecks>>,
}

impl<C: ChunkCopier> Loader<C> {
    pub fn new(
        copier: C,
        map: Arc<Mmap>,
        direct: bool,
        (pace, disk): (Option<f64>, Option<Box<dyn BlobSource>>),
        counters: Arc<LoadCounters>,
    ) -> crate::Result<Self> {
        let fill_pool = rayon::ThreadPoolBuilder::new()
            .num_threads(FILL_THREADS)
            .thread_name(|i| format!("hob-fill-{i}"))
            .build()
            .map_err(|e| Error::Loader(format!("cannot start the loader's copy threads: {e}")))?;
        Ok(Loader {
            copier,
            map,
            direct,
            // Direct copies are paced by the device itself.
            pace: pace.filter(|_| !direct),
            link_free: Instant::now(),
            disk,
            counters,
            fill_pool,
            checks: None,
        })
    }

    /// Check each blob's checksum (`checks`, the file's) the first time a job loads from it.
    pub fn with_checks(mut self, checks: Arc<BlobChecks>) -> Self {
        self.checks = Some(checks);
        self
    }

    /// The checksum of the blob `job` loads from, unless checked already: computed on the fill
    /// threads from the mapped file while the job's last copies cross (a first load only).
    fn check_blob(&self, job: &LoadJob<C::Event>) -> crate::Result<()> {
        let Some(checks) = &self.checks else {
            return Ok(());
        };
        let pool = &self.fill_pool;
        let crc = |data: &[u8]| {
            crc32c_pieces(data, CRC_PIECE, |pieces| {
                pool.install(|| pieces.par_iter().map(|p| crc32c::crc32c(p)).collect())
            })
        };
        Ok(checks.range(job.src.clone(), crc)?)
    }
}

impl<C: ChunkCopier> Worker for Loader<C> {
    type Job = LoadJob<C::Event>;
    type Done = Done<C::Event>;

    fn chunks(&mut self, job: &Self::Job) -> usize {
        job.chunks()
    }

    fn run_chunk(&mut self, job: &Self::Job, i: usize) -> crate::Result<()> {
        if job
            .abort
            .as_ref()
            .is_some_and(|a| a.load(Ordering::Acquire))
        {
            return Err(Error::Cancelled("prefetch proven wrong"));
        }
        let started = Instant::now();
        // The slot-to-slot copy crosses no link: kept out of the link's busy time.
        let mut within = Duration::ZERO;
        if i == 0 {
            self.copier.after(&job.after, job.mapped)?;
            if let Some(c) = job.prefix {
                let t = Instant::now();
                self.copier.copy_within(c.from, c.to, c.len, job.mapped)?;
                within = t.elapsed();
            }
        }
        let (src, dst) = job.chunk(i);
        let len = src.len();
        let mut paced = None;
        let (pool, map, disk, counters) =
            (&self.fill_pool, &self.map, &mut self.disk, &self.counters);
        let (pace, link_free) = (self.pace, &mut self.link_free);
        if job.mapped {
            // The emulated disk or link carries the chunk from when its read starts (the copy
            // out of the page cache stands in for that transfer, and overlaps it).
            let began = Instant::now();
            self.copier.fill_mapped(dst, len, &mut |buf| {
                fill(pool, map, disk, src.clone(), buf, counters)
            })?;
            pace_chunk(pace, link_free, len, Some(began));
        } else if self.direct {
            paced = self.copier.copy_direct(&self.map[src], dst)?;
        } else {
            // Filled while the previous chunk crosses, then across once the link is free (as a
            // card's DMA follows its staging copy).
            self.copier.copy_staged(dst, len, &mut |buf| {
                fill(pool, map, disk, src.clone(), buf, counters)?;
                pace_chunk(pace, link_free, len, None);
                Ok(())
            })?;
        }
        self.counters.bytes.fetch_add(len as u64, Ordering::Relaxed);
        // Paced on the device: the link is busy for the chunk's crossing time.
        let busy = paced.unwrap_or_else(|| started.elapsed().saturating_sub(within));
        self.counters
            .nanos
            .fetch_add(busy.as_nanos() as u64, Ordering::Relaxed);
        Ok(())
    }

    fn complete(&mut self, job: &Self::Job) -> crate::Result<Self::Done> {
        // A blob that fails its checksum fails the load: whoever waits for it gets the error
        // (naming the file and the expert) before computing with the slot.
        self.check_blob(job)?;
        // The job is through the emulated link when its last chunk is.
        let waited = Instant::now();
        if self.pace.is_some() {
            sleep_until(self.link_free);
        }
        self.counters
            .nanos
            .fetch_add(waited.elapsed().as_nanos() as u64, Ordering::Relaxed);
        if job.mapped {
            Ok(None)
        } else {
            self.copier.fence().map(Some)
        }
    }
}

/// Emulated link (a profile's pace): chunks cross it one after another at `pace` bytes/s;
/// interleaved jobs (a demand overtaking a prefetch) share it. `began`: when the chunk's
/// transfer was issued, where the fill is that transfer (a read into a mapped slot); else it
/// crosses once filled.
fn pace_chunk(pace: Option<f64>, link_free: &mut Instant, len: usize, began: Option<Instant>) {
    let Some(bw) = pace else {
        return;
    };
    sleep_until(*link_free);
    // A chunk that follows the previous one without a real gap crosses right behind it, so the
    // link keeps its rate (never faster than the link: the clock advances len / bw per chunk).
    let now = Instant::now();
    let start = match began {
        Some(b) => b.max(*link_free),
        None if now.saturating_duration_since(*link_free) < PACE_SLACK => *link_free,
        None => now,
    };
    *link_free = start + Duration::from_secs_f64(len as f64 / bw);
}

fn sleep_until(t: Instant) {
    if let Some(rest) = t.checked_duration_since(Instant::now()) {
        std::thread::sleep(rest);
    }
}

/// Bytes `src` of the file into `dst`: from the SSD when a reader is set, else copied out of the
/// mapped file by the fill threads.
fn fill(
    pool: &rayon::ThreadPool,
    map: &Mmap,
    disk: &mut Option<Box<dyn BlobSource>>,
    src: Range<usize>,
    dst: &mut [u8],
    counters: &LoadCounters,
) -> crate::Result<()> {
    match disk {
        Some(r) => {
            r.read_into(src.start as u64, dst)?;
            counters
                .disk_bytes
                .fetch_add(dst.len() as u64, Ordering::Relaxed);
        }
        None => pool.install(|| {
            dst.par_chunks_mut(1 << 20)
                .zip(map[src].par_chunks(1 << 20))
                .for_each(|(d, s)| d.copy_from_slice(s))
        }),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::slots::nested_prefix;
    use super::*;
    use crate::experts::scheduler::{Priority, Scheduler};
    use crate::format::{
        DType, DenseSpec, ExpertShape, HobFile, HobWriter, Metadata, Variant, BLOB_ALIGN,
    };

    /// A device whose memory is one host buffer: staged copies land in it, events are done.
    struct HostCopier(Arc<std::sync::Mutex<Vec<u8>>>);
    struct Done;

    impl DeviceEvent for Done {
        fn is_complete(&self) -> bool {
            true
        }
        fn synchronize(&self) -> crate::Result<()> {
            Ok(())
        }
        fn seconds_until(&self, _later: &Self) -> crate::Result<f64> {
            Ok(0.0)
        }
    }

    impl ChunkCopier for HostCopier {
        type Event = Done;
        fn after(&mut self, _ev: &Done, _on_host: bool) -> crate::Result<()> {
            Ok(())
        }
        fn fill_mapped(
            &mut self,
            dst: u64,
            len: usize,
            fill: &mut dyn FnMut(&mut [u8]) -> crate::Result<()>,
        ) -> crate::Result<()> {
            self.copy_staged(dst, len, fill)
        }
        fn copy_staged(
            &mut self,
            dst: u64,
            len: usize,
            fill: &mut dyn FnMut(&mut [u8]) -> crate::Result<()>,
        ) -> crate::Result<()> {
            let mut mem = self
                .0
                .lock()
                .map_err(|_| Error::Loader("poisoned".into()))?;
            fill(&mut mem[dst as usize..dst as usize + len])
        }
        fn copy_direct(&mut self, src: &[u8], dst: u64) -> crate::Result<Option<Duration>> {
            let mut mem = self
                .0
                .lock()
                .map_err(|_| Error::Loader("poisoned".into()))?;
            mem[dst as usize..dst as usize + src.len()].copy_from_slice(src);
            Ok(None)
        }
        fn copy_within(
            &mut self,
            from: u64,
            to: u64,
            len: usize,
            _mapped: bool,
        ) -> crate::Result<()> {
            let mut mem = self
                .0
                .lock()
                .map_err(|_| Error::Loader("poisoned".into()))?;
            let from = from as usize;
            mem.copy_within(from..from + len, to as usize);
            Ok(())
        }
        fn fence(&mut self) -> crate::Result<Done> {
            Ok(Done)
        }
    }

    /// A file of 1 layer x 2 experts in f16 ([64, 128]): its path, with the byte at `flip`
    /// bytes into expert 1's blob flipped.
    fn file_with_flip(dir: &std::path::Path, flip: usize) -> std::path::PathBuf {
        let path = dir.join("m.hob");
        let shape = ExpertShape {
            n_layers: 1,
            n_experts: 2,
            hidden: 64,
            ffn: 128,
        };
        let variants = [Variant::parse("f16", None).unwrap()];
        let dense = [DenseSpec {
            name: "output_norm.weight".into(),
            dtype: DType::F32.into(),
            shape: vec![64],
        }];
        let mut w = HobWriter::create(&path, &Metadata::new(), &dense, shape, &variants).unwrap();
        w.write_dense(0, &[0u8; 256]).unwrap();
        let size = variants[0].expert_layout(64, 128).unwrap().size;
        for e in 0..2 {
            let blob: Vec<u8> = (0..size).map(|i| (i * 31 + e * 7) as u8).collect();
            w.write_expert(0, e, 0, &blob).unwrap();
        }
        w.finish().unwrap();
        let mut bytes = std::fs::read(&path).unwrap();
        let f = HobFile::open(&path).unwrap();
        bytes[f.expert_record(0, 1, 0).offset as usize + flip] ^= 0x20;
        drop(f);
        std::fs::write(&path, bytes).unwrap();
        path
    }

    #[test]
    fn flipped_expert_byte_fails_its_checksum_on_first_load() {
        let dir = tempfile::tempdir().unwrap();
        let path = file_with_flip(dir.path(), 5000);
        let file = HobFile::open(&path).unwrap();
        let mem = Arc::new(std::sync::Mutex::new(vec![0u8; 1 << 20]));
        let loader = Loader::new(
            HostCopier(mem),
            file.shared_map(),
            false,
            (None, None),
            Arc::new(LoadCounters::default()),
        )
        .unwrap()
        .with_checks(file.blob_checks());
        let loader = Scheduler::spawn(loader).unwrap();
        let load = |e: usize, part: usize| {
            // A whole blob, or (part 1) from its second page on, as a mapped slot's later
            // matrices load.
            let r = file.blob_range(0, e, 0, true);
            let job = LoadJob {
                src: r.start + part * BLOB_ALIGN..r.end,
                dst: 0,
                mapped: false,
                prefix: None,
                after: Done,
                abort: None,
            };
            loader.submit(job, Priority::Demand).unwrap().wait()
        };
        load(0, 0).unwrap();
        let checks = file.blob_checks();
        assert!(checks.is_verified(checks.index(0, 0, 0).unwrap()));
        for part in [0, 1] {
            let msg = load(1, part).err().unwrap().to_string();
            assert!(
                msg.starts_with(&path.display().to_string())
                    && msg.contains("checksum mismatch in expert (layer 0, expert 1, variant f16)"),
                "{msg}"
            );
        }
        assert!(!checks.is_verified(checks.index(0, 1, 0).unwrap()));
        loader.shutdown().unwrap();
    }

    /// Issue 54: a high load whose low copy (a narrower width of the same ap8 blob) is in
    /// another slot takes that copy's bytes slot to slot and reads only the rest of the file:
    /// the slot ends up byte for byte the high view's blob. Variants that do not nest (the low
    /// wider, another kind) take nothing.
    #[test]
    fn a_high_load_completes_a_narrower_ap8_copy_with_the_missing_planes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ap.hob");
        let shape = ExpertShape {
            n_layers: 1,
            n_experts: 2,
            hidden: 64,
            ffn: 128,
        };
        let variants = [
            Variant::parse("ap8", None).unwrap(),
            Variant::parse("int8", Some(64)).unwrap(),
        ];
        let mut w = HobWriter::create(&path, &Metadata::new(), &[], shape, &variants).unwrap();
        for (v, var) in variants.iter().enumerate() {
            let size = var.expert_layout(64, 128).unwrap().size;
            for e in 0..2 {
                let blob: Vec<u8> = (0..size).map(|i| (i * 13 + e * 5 + v) as u8).collect();
                w.write_expert(0, e, v, &blob).unwrap();
            }
        }
        w.finish().unwrap();
        let file = HobFile::open(&path).unwrap();
        let idx = |name: &str| {
            let names: Vec<String> = file.variants().iter().map(|v| v.to_string()).collect();
            names.iter().position(|n| n == name).unwrap()
        };
        let (hi, lo) = (idx("ap8@5"), idx("ap8@3"));
        let lo_size = file.expert_layout(lo).size;
        let cut = nested_prefix(&file, hi, lo).unwrap();
        assert_eq!(cut, lo_size / BLOB_ALIGN * BLOB_ALIGN);
        assert!(cut > 0);
        assert_eq!(nested_prefix(&file, lo, hi), None);
        assert_eq!(nested_prefix(&file, hi, idx("int8/g64")), None);

        let mem = Arc::new(std::sync::Mutex::new(vec![0u8; 1 << 20]));
        let counters = Arc::new(LoadCounters::default());
        let loader = Loader::new(
            HostCopier(mem.clone()),
            file.shared_map(),
            false,
            (None, None),
            counters.clone(),
        )
        .unwrap();
        let loader = Scheduler::spawn(loader).unwrap();
        let (low_slot, high_slot) = (0u64, 1u64 << 19);
        let low = file.blob_range(0, 1, lo, false);
        let job = |src: Range<usize>, dst, prefix| LoadJob {
            src,
            dst,
            mapped: false,
            prefix,
            after: Done,
            abort: None,
        };
        let run = |j| loader.submit(j, Priority::Demand).unwrap().wait().unwrap();
        run(job(low.clone(), low_slot, None));
        let high = file.blob_range(0, 1, hi, false);
        let copy = SlotCopy {
            from: low_slot,
            to: high_slot,
            len: cut,
        };
        let rest = high.start + cut..high.end;
        run(job(rest.clone(), high_slot + cut as u64, Some(copy)));
        let mem = mem.lock().unwrap();
        let at = high_slot as usize;
        assert_eq!(&mem[at..at + high.len()], &file.shared_map()[high.clone()]);
        let moved = counters.bytes.load(Ordering::Relaxed) as usize;
        assert_eq!(moved, low.len() + rest.len());
        drop(mem);
        loader.shutdown().unwrap();
    }

    /// A disk reader that fails its `fail_at`-th read (counting from 0) with EIO, or blocks
    /// forever on it (`hang`), and otherwise reads the file.
    struct FaultyDisk {
        inner: crate::experts::io::PreadReader,
        reads: usize,
        fail_at: usize,
        hang: Option<crossbeam_channel::Receiver<()>>,
    }

    impl BlobSource for FaultyDisk {
        fn read_into(&mut self, offset: u64, dst: &mut [u8]) -> crate::Result<()> {
            let n = self.reads;
            self.reads += 1;
            if n == self.fail_at {
                if let Some(never) = &self.hang {
                    let _ = never.recv();
                }
                return Err(Error::io(
                    "faulty-disk",
                    "read",
                    std::io::Error::from_raw_os_error(libc::EIO),
                ));
            }
            self.inner.read_into(offset, dst)
        }
        fn reader_kind(&self) -> &'static str {
            "faulty"
        }
        fn alignment(&self) -> usize {
            1
        }
    }

    /// A loader over the SSD tier of `path` reading through `disk`, and a whole-blob load.
    fn disk_loader(
        file: &HobFile,
        disk: Box<dyn BlobSource>,
        stall: Duration,
    ) -> Scheduler<Loader<HostCopier>> {
        let mem = Arc::new(std::sync::Mutex::new(vec![0u8; 1 << 20]));
        let counters = Arc::new(LoadCounters::default());
        let loader = Loader::new(
            HostCopier(mem),
            file.shared_map(),
            false,
            (None, Some(disk)),
            counters,
        )
        .unwrap();
        Scheduler::spawn_with(loader, stall).unwrap()
    }

    fn load_blob(
        loader: &Scheduler<Loader<HostCopier>>,
        file: &HobFile,
        e: usize,
    ) -> crate::Result<Option<Done>> {
        let job = LoadJob {
            src: file.blob_range(0, e, 0, true),
            dst: 0,
            mapped: false,
            prefix: None,
            after: Done,
            abort: None,
        };
        loader.submit(job, Priority::Demand)?.wait()
    }

    /// Issue 55, faults: an I/O error on the n-th read of the SSD tier fails that load with the
    /// error, and the loads after it go on.
    #[test]
    fn an_io_error_on_the_nth_disk_read_fails_that_load_only() {
        let dir = tempfile::tempdir().unwrap();
        let path = file_with_flip(dir.path(), 0);
        let file = HobFile::open(&path).unwrap();
        for fail_at in 0..3 {
            let disk = FaultyDisk {
                inner: crate::experts::io::PreadReader::open(&path, false).unwrap(),
                reads: 0,
                fail_at,
                hang: None,
            };
            let loader = disk_loader(&file, Box::new(disk), Duration::from_secs(10));
            for n in 0..3 {
                let got = load_blob(&loader, &file, 0);
                match got {
                    Err(e) => {
                        assert_eq!(n, fail_at, "{e}");
                        let msg = e.to_string();
                        assert!(msg.contains("faulty-disk") && msg.contains("read"), "{msg}");
                    }
                    Ok(_) => assert_ne!(n, fail_at),
                }
            }
            loader.shutdown().unwrap();
        }
    }

    /// Issue 55, faults: the file shrinks under the SSD reader (a short read): the load fails
    /// naming the file and offset.
    #[test]
    fn a_file_truncated_under_the_disk_reader_is_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = file_with_flip(dir.path(), 0);
        let file = HobFile::open(&path).unwrap();
        let reader = crate::experts::io::PreadReader::open(&path, false).unwrap();
        let blob = file.blob_range(0, 1, 0, true);
        let loader = disk_loader(&file, Box::new(reader), Duration::from_secs(10));
        let copy = dir.path().join("copy.hob");
        std::fs::copy(&path, &copy).unwrap();
        let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        f.set_len(blob.start as u64 + 100).unwrap();
        let msg = load_blob(&loader, &file, 1).err().unwrap().to_string();
        assert!(
            msg.contains(&path.display().to_string())
                && msg.contains("the file ended early")
                && msg.contains(&format!("offset {}", blob.start + 100)),
            "{msg}"
        );
        loader.shutdown().unwrap();
    }

    /// Issue 55, faults: a disk read that never returns is an error after the stall limit, and
    /// shutting down leaves the stuck thread behind instead of hanging.
    #[test]
    fn a_disk_read_that_never_returns_is_an_error_not_a_hang() {
        let dir = tempfile::tempdir().unwrap();
        let path = file_with_flip(dir.path(), 0);
        let file = HobFile::open(&path).unwrap();
        let (_never, hang) = crossbeam_channel::bounded::<()>(0);
        let disk = FaultyDisk {
            inner: crate::experts::io::PreadReader::open(&path, false).unwrap(),
            reads: 0,
            fail_at: 1,
            hang: Some(hang),
        };
        let loader = disk_loader(&file, Box::new(disk), Duration::from_millis(300));
        load_blob(&loader, &file, 0).unwrap();
        let msg = load_blob(&loader, &file, 1).err().unwrap().to_string();
        assert!(msg.contains("made no progress for 0.3 s"), "{msg}");
        let msg = loader.shutdown().err().unwrap().to_string();
        assert!(msg.contains("left behind"), "{msg}");
    }
}
