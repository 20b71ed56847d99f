//! The logits file of `hob perplexity --kl-divergence-base FILE` (llama.cpp's flag of the same
//! name): one run writes the logits of every scored token, a later run (another build, another
//! variant, other kernels) reads them back and reports its KL divergence from them. Two processes
//! compare where one process cannot hold both configurations (kernel choices fixed at start-up).
//!
//! Layout, little-endian: the magic `HOBKLD01`; u32 vocab, ctx, chunks, scored positions per
//! chunk; then per chunk its ctx token ids (u32) and its scored rows of vocab f32 logits. A run
//! that reads the file checks every field and each chunk's tokens against its own, so a file of
//! another text, tokenizer, model vocabulary or chunking is refused by name.

use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use crate::Error;

const MAGIC: &[u8; 8] = b"HOBKLD01";

/// The shape a run scores: the file's header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    pub vocab: usize,
    pub ctx: usize,
    pub chunks: usize,
    pub scored: usize,
}

impl Shape {
    fn encode(&self) -> crate::Result<[u8; 24]> {
        let mut h = [0u8; 24];
        h[..8].copy_from_slice(MAGIC);
        for (i, v) in [self.vocab, self.ctx, self.chunks, self.scored]
            .into_iter()
            .enumerate()
        {
            let v = u32::try_from(v)
                .map_err(|_| Error::Invalid(format!("logits file: {v} does not fit in 32 bits")))?;
            h[8 + 4 * i..12 + 4 * i].copy_from_slice(&v.to_le_bytes());
        }
        Ok(h)
    }
}

/// Writes the file beside its final name and renames it there only once every chunk is in:
/// a run that fails or is interrupted leaves no file (or the previous one) behind.
pub struct Writer {
    path: PathBuf,
    out: BufWriter<tempfile::NamedTempFile>,
    shape: Shape,
    written: usize,
}

impl Writer {
    pub fn create(path: &Path, shape: Shape) -> crate::Result<Self> {
        // The file is renamed into place at the end: that would replace a device or a FIFO.
        if std::fs::metadata(path).is_ok_and(|m| !m.is_file()) {
            return Err(Error::Invalid(format!(
                "logits file {}: exists and is not a regular file (a directory, device or FIFO); \
                 give the path of a file to write",
                path.display()
            )));
        }
        let dir = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        let tmp = tempfile::Builder::new()
            .prefix(".hob-kld-")
            .tempfile_in(dir)
            .map_err(|e| Error::io(dir, "create a temporary file in", e))?;
        let mut out = BufWriter::with_capacity(1 << 20, tmp);
        out.write_all(&shape.encode()?)
            .map_err(|e| Error::io(path, "write", e))?;
        Ok(Writer {
            path: path.to_owned(),
            out,
            shape,
            written: 0,
        })
    }

    /// One chunk: its tokens and the logits of its scored positions, row after row.
    pub fn chunk(&mut self, tokens: &[u32], logits: &[f32]) -> crate::Result<()> {
        let s = self.shape;
        if tokens.len() != s.ctx || logits.len() != s.scored * s.vocab || self.written == s.chunks {
            return Err(Error::Invalid(format!(
                "logits file {}: chunk {} of {} tokens and {} logits does not match {s:?}",
                self.path.display(),
                self.written + 1,
                tokens.len(),
                logits.len()
            )));
        }
        let w = |out: &mut BufWriter<_>, b: &[u8]| {
            out.write_all(b)
                .map_err(|e| Error::io(&self.path, "write", e))
        };
        w(&mut self.out, bytemuck::cast_slice(&le_u32(tokens)))?;
        if cfg!(target_endian = "little") {
            w(&mut self.out, bytemuck::cast_slice(logits))?;
        } else {
            let v: Vec<u8> = logits.iter().flat_map(|x| x.to_le_bytes()).collect();
            w(&mut self.out, &v)?;
        }
        self.written += 1;
        Ok(())
    }

    /// Flush, sync and rename onto the final name (every chunk must have been written).
    pub fn finish(self) -> crate::Result<()> {
        if self.written != self.shape.chunks {
            return Err(Error::Invalid(format!(
                "logits file {}: {} of {} chunks written",
                self.path.display(),
                self.written,
                self.shape.chunks
            )));
        }
        let tmp = self
            .out
            .into_inner()
            .map_err(|e| Error::io(&self.path, "write", e.into_error()))?;
        tmp.as_file()
            .sync_all()
            .map_err(|e| Error::io(tmp.path(), "fsync", e))?;
        tmp.persist(&self.path)
            .map_err(|e| Error::io(&self.path, "rename onto", e.error))?;
        Ok(())
    }
}

/// The little-endian u32 at the start of `b` (at least 4 bytes: callers slice fixed headers and
/// `chunks_exact(4)`).
fn u32_at(b: &[u8]) -> u32 {
    u32::from_le_bytes([b[0], b[1], b[2], b[3]])
}

fn le_u32(v: &[u32]) -> Vec<u32> {
    v.iter().map(|x| x.to_le()).collect()
}

/// Reads a file that `Writer` wrote, chunk after chunk, checking it against this run's shape.
pub struct Reader {
    path: PathBuf,
    input: BufReader<File>,
    shape: Shape,
    read: usize,
    bytes: Vec<u8>,
}

impl Reader {
    /// Open `path` for a run of `want` (the file may hold more chunks than the run scores).
    pub fn open(path: &Path, want: Shape) -> crate::Result<Self> {
        let f = File::open(path).map_err(|e| Error::io(path, "open", e))?;
        let mut input = BufReader::with_capacity(1 << 20, f);
        let mut h = [0u8; 24];
        input
            .read_exact(&mut h)
            .map_err(|e| Error::io(path, "read the header (too short for a logits file)", e))?;
        if &h[..8] != MAGIC {
            return Err(Error::Invalid(format!(
                "{}: not a logits file written by `hob perplexity --kl-divergence-base` \
                 (magic {:?})",
                path.display(),
                String::from_utf8_lossy(&h[..8])
            )));
        }
        let field = |i: usize| u32_at(&h[8 + 4 * i..]);
        let shape = Shape {
            vocab: field(0) as usize,
            ctx: field(1) as usize,
            chunks: field(2) as usize,
            scored: field(3) as usize,
        };
        let mismatch = |what: &str, file: usize, run: usize| {
            Err(Error::Invalid(format!(
                "{}: written with {what} {file}, this run has {run}",
                path.display()
            )))
        };
        if shape.vocab != want.vocab {
            return mismatch("vocabulary", shape.vocab, want.vocab);
        }
        if shape.ctx != want.ctx {
            return mismatch("--ctx-size", shape.ctx, want.ctx);
        }
        if shape.scored != want.scored {
            return mismatch("scored positions per chunk", shape.scored, want.scored);
        }
        if shape.chunks < want.chunks {
            return mismatch("chunks", shape.chunks, want.chunks);
        }
        // The file's length must be what its header says (a truncated copy fails here, not
        // midway through the run).
        let per_chunk = (4 * shape.ctx + 4 * shape.scored * shape.vocab) as u64;
        let expect = (shape.chunks as u64)
            .saturating_mul(per_chunk)
            .saturating_add(24);
        let len = input
            .get_ref()
            .metadata()
            .map_err(|e| Error::io(path, "stat", e))?
            .len();
        if len != expect {
            return Err(Error::Invalid(format!(
                "{}: {len} bytes, its header says {expect} (truncated or not a logits file)",
                path.display()
            )));
        }
        Ok(Reader {
            path: path.to_owned(),
            input,
            shape,
            read: 0,
            bytes: Vec::new(),
        })
    }

    /// The next chunk's logits into `logits` (scored rows of vocab), checking its tokens are
    /// `tokens`.
    pub fn chunk(&mut self, tokens: &[u32], logits: &mut Vec<f32>) -> crate::Result<()> {
        let s = self.shape;
        let chunk = self.read + 1;
        let path = &self.path;
        self.bytes.resize(4 * s.ctx, 0);
        self.input
            .read_exact(&mut self.bytes)
            .map_err(|e| Error::io(path, "read", e))?;
        let same = tokens.len() == s.ctx
            && self
                .bytes
                .chunks_exact(4)
                .zip(tokens)
                .all(|(b, &t)| u32_at(b) == t);
        if !same {
            return Err(Error::Invalid(format!(
                "{}: chunk {chunk}'s tokens differ from this run's (another text, tokenizer or \
                 --ctx-size?)",
                path.display()
            )));
        }
        self.bytes.resize(4 * s.scored * s.vocab, 0);
        self.input
            .read_exact(&mut self.bytes)
            .map_err(|e| Error::io(path, "read", e))?;
        logits.clear();
        logits.extend(
            self.bytes
                .chunks_exact(4)
                .map(|b| f32::from_bits(u32_at(b))),
        );
        self.read += 1;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape() -> Shape {
        Shape {
            vocab: 5,
            ctx: 4,
            chunks: 2,
            scored: 1,
        }
    }

    #[test]
    fn round_trip_and_refusals() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("base.kld");
        let mut w = Writer::create(&path, shape()).unwrap();
        w.chunk(&[1, 2, 3, 4], &[0.5, -1.0, 2.0, 3.0, f32::MIN])
            .unwrap();
        // Nothing under the final name until finish.
        assert!(!path.exists());
        w.chunk(&[5, 6, 7, 8], &[1.0; 5]).unwrap();
        assert!(w.chunk(&[5, 6, 7, 8], &[1.0; 5]).is_err(), "a third chunk");
        w.finish().unwrap();

        let mut r = Reader::open(&path, shape()).unwrap();
        let mut l = Vec::new();
        r.chunk(&[1, 2, 3, 4], &mut l).unwrap();
        assert_eq!(l, [0.5, -1.0, 2.0, 3.0, f32::MIN]);
        let e = r.chunk(&[5, 6, 7, 9], &mut l).unwrap_err().to_string();
        assert!(e.contains("chunk 2's tokens differ"), "{e}");

        // Fewer chunks than written is fine; another vocabulary or ctx is refused by name.
        assert!(Reader::open(
            &path,
            Shape {
                chunks: 1,
                ..shape()
            }
        )
        .is_ok());
        let e = Reader::open(
            &path,
            Shape {
                vocab: 6,
                ..shape()
            },
        )
        .err()
        .unwrap()
        .to_string();
        assert!(e.contains("vocabulary 5, this run has 6"), "{e}");
        let e = Reader::open(
            &path,
            Shape {
                chunks: 3,
                ..shape()
            },
        )
        .err()
        .unwrap()
        .to_string();
        assert!(e.contains("chunks 2, this run has 3"), "{e}");

        // Truncated: refused before any chunk is read.
        let bytes = std::fs::read(&path).unwrap();
        let cut = dir.path().join("cut.kld");
        std::fs::write(&cut, &bytes[..bytes.len() - 3]).unwrap();
        let e = Reader::open(&cut, shape()).err().unwrap().to_string();
        assert!(e.contains("truncated"), "{e}");
        std::fs::write(&cut, b"GGUF and more bytes than a header").unwrap();
        let e = Reader::open(&cut, shape()).err().unwrap().to_string();
        assert!(e.contains("not a logits file"), "{e}");
    }

    #[test]
    fn unfinished_writer_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("base.kld");
        let mut w = Writer::create(&path, shape()).unwrap();
        w.chunk(&[1, 2, 3, 4], &[0.0; 5]).unwrap();
        assert!(w.finish().is_err());
        assert!(!path.exists());
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }
}
