//! What the offload engine (experts::engine) asks of a device: memory for slots of experts,
//! chunk copies ordered by events, and expert products computed from those slots. A backend
//! implements [`ExpertDevice`]; the engine decides what goes where and never sees the device's
//! own types beyond these.

use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use memmap2::Mmap;

use super::experts::{BeforeExperts, ExpertFfn, MoeBlock};
use super::ops::Backend;
use crate::format::ExpertView;
use crate::quant::Matrix;

/// A point in a device's work: after some launches, or after a load's copies.
pub trait DeviceEvent: Send + 'static {
    /// Whether the work before it has finished (false on an error: `synchronize` reports it).
    fn is_complete(&self) -> bool;
    /// Wait on the host until it has.
    fn synchronize(&self) -> crate::Result<()>;
    /// Seconds from `self` to `later` on the device's clock (both recorded timed, both done).
    fn seconds_until(&self, later: &Self) -> crate::Result<f64>;
}

/// The device side of the loader thread: copies of file bytes into slots, chunk by chunk, in
/// order, with an event after any of them. Used only from that thread.
pub trait ChunkCopier: Send + 'static {
    type Event: DeviceEvent;
    /// Later copies wait for `ev` (compute still reading the destination's previous expert):
    /// on the device, or on the host (`on_host`: the destination is written by the CPU).
    fn after(&mut self, ev: &Self::Event, on_host: bool) -> crate::Result<()>;
    /// `len` bytes at host address `dst` of a mapped arena, written by `fill`.
    fn fill_mapped(
        &mut self,
        dst: u64,
        len: usize,
        fill: &mut dyn FnMut(&mut [u8]) -> crate::Result<()>,
    ) -> crate::Result<()>;
    /// `len` bytes written by `fill` into a staging buffer, then copied to device address `dst`.
    fn copy_staged(
        &mut self,
        dst: u64,
        len: usize,
        fill: &mut dyn FnMut(&mut [u8]) -> crate::Result<()>,
    ) -> crate::Result<()>;
    /// `src` (page-locked pages of the mapped file) copied by DMA to device address `dst`.
    /// Returns the time the emulated link is busy with it when the device paces the copies.
    fn copy_direct(&mut self, src: &[u8], dst: u64) -> crate::Result<Option<Duration>>;
    /// `len` bytes from one slot to another (`from`, `to`: device addresses, or host addresses
    /// of a mapped arena), in order with the copies before and after it; no link is crossed.
    fn copy_within(&mut self, from: u64, to: u64, len: usize, mapped: bool) -> crate::Result<()>;
    /// An event after every copy queued so far.
    fn fence(&mut self) -> crate::Result<Self::Event>;
}

/// How the loader's copier is set up.
pub struct CopierSetup {
    /// The model file's mapping.
    pub map: Arc<Mmap>,
    /// File ranges to page-lock for direct copies (None: copies go through staging or into a
    /// mapped arena).
    pub pin: Option<Vec<Range<usize>>>,
    /// Staging buffers for copies to device memory (false: mapped arenas only).
    pub staging: bool,
    /// An emulated link of this many bytes per second, paced by the device for direct copies.
    pub pace: Option<f64>,
}

/// A slot arena's first byte: where the device reads it, and where the host writes it (mapped
/// arenas; 0 for device memory).
#[derive(Clone, Copy, Debug)]
pub struct ArenaBase {
    pub device: u64,
    pub host: usize,
}

/// One decode token's expert in a slot: its index (the routed kernels sum in ascending expert
/// order), its gate weight, and its matrices.
pub type SlotExpert<E> = (usize, f32, E);

/// The device the offload engine drives: an arena of expert slots, copies into them, and the
/// expert products of one MoE layer computed from them.
pub trait ExpertDevice: Backend {
    /// One expert's gate, up and down matrices where the device reads them.
    type Expert: Copy;
    /// Memory of one pool of slots.
    type Arena;
    type Event: DeviceEvent;
    type Copier: ChunkCopier<Event = Self::Event>;
    /// Buffers of a layer's expert products (grown to the largest batch).
    type Work;
    /// Every expert of the model resident in slots, for decode routed on the device.
    type Resident;
    /// The most experts of one token `experts_routed` takes.
    const ROUTED_MAX_K: usize;

    /// The device's name, for messages.
    fn device_name(&self) -> String;
    /// Device memory free now, bytes.
    fn free_memory(&self) -> crate::Result<usize>;
    /// Bytes of the weights kept resident (the non-expert weights).
    fn resident_bytes(&self) -> usize;
    /// An arena of `bytes`: device memory, or (`mapped`) page-locked host memory the device
    /// reads in place.
    fn alloc_arena(&self, bytes: usize, mapped: bool) -> crate::Result<Self::Arena>;
    fn arena_base(&self, arena: &Self::Arena) -> ArenaBase;
    /// The expert stored as `view` lays it out, copied to device address `at`.
    fn expert_at(&self, at: u64, view: &ExpertView<'_>) -> Self::Expert;
    /// The loader's copier, and whether it copies directly from page-locked file pages
    /// (`setup.pin` registered; false: staging, after a logged reason).
    fn copier(&self, setup: CopierSetup) -> crate::Result<(Self::Copier, bool)>;
    /// An event after the launches made so far (`timed`: for `seconds_until`).
    fn record_event(&self, timed: bool) -> crate::Result<Self::Event>;
    /// Later launches wait for `ev`.
    fn wait_event(&self, ev: &Self::Event) -> crate::Result<()>;
    /// An event with nothing before it: what waits for it waits for nothing.
    fn done_event(&self) -> crate::Result<Self::Event>;
    /// Wait on the host for every launch made so far.
    fn synchronize(&self) -> crate::Result<()>;
    /// Keep `m` on the device, so that `Backend::matmul` takes it (the stacked gates).
    fn keep_resident(&mut self, m: &Matrix<'_>) -> crate::Result<()>;

    /// Buffers for the products of experts of `hidden` x `ffn`.
    fn expert_work(&self, hidden: usize, ffn: usize) -> crate::Result<Self::Work>;
    /// out[..n] = 0.
    fn zero(&self, out: &mut Self::Buf, n: usize) -> crate::Result<()>;
    /// Before a layer's experts: room for `rows` expert outputs (decode: one per routed
    /// expert; prefill: the batch), for a prefill batch its routed rows grouped by expert
    /// (token indices and gate weights) for `expert_rows`, and what the layer's experts compute
    /// beyond their products (`ffn`: `expert_step` and `expert_rows` apply it; the other
    /// products are only asked of a layer whose `ffn` is plain).
    fn begin_layer(
        &self,
        work: &mut Self::Work,
        rows: usize,
        routed: (&[i32], &[f32]),
        ffn: &ExpertFfn,
    ) -> crate::Result<()>;
    /// out[idx[i]] += wts[i] * expert(x[idx[i]]) for `rows` = (at, n): the n rows from row
    /// `at` of `begin_layer`'s; the expert is `e`, model expert `expert` (its biases).
    fn expert_rows(
        &self,
        work: &mut Self::Work,
        e: (&Self::Expert, usize),
        x: &Self::Buf,
        rows: (usize, usize),
        out: &mut Self::Buf,
    ) -> crate::Result<()>;
    /// `expert_rows` of every group of a prefill layer at once (`groups`: each expert with its
    /// `n` rows from row `at` of `begin_layer`'s, the groups covering them in order, ascending
    /// by expert; `t` tokens of at most `k` rows each), in a few launches where the device can:
    /// the same sums, bit for bit. False (nothing done) where it cannot.
    fn experts_grouped(
        &self,
        work: &mut Self::Work,
        groups: &[(usize, usize, Self::Expert)],
        x: &Self::Buf,
        tokens: (usize, usize),
        out: &mut Self::Buf,
    ) -> crate::Result<bool>;
    /// Step `step` of one token's expert (`e`, model expert `expert`), its output kept in row
    /// `row` of the work: 0 the gate product, 1 the up product and the activation, 2 the down
    /// product. Each step reads only its own matrix.
    fn expert_step(
        &self,
        work: &mut Self::Work,
        e: (&Self::Expert, usize),
        x: &Self::Buf,
        row: usize,
        step: usize,
    ) -> crate::Result<()>;
    /// out[..hidden] += weight * row `row` of the work's expert outputs.
    fn add_row(
        &self,
        work: &Self::Work,
        row: usize,
        weight: f32,
        out: &mut Self::Buf,
    ) -> crate::Result<()>;
    /// out[..hidden] += host (a result computed elsewhere).
    fn add_host(&self, work: &Self::Work, host: &[f32], out: &mut Self::Buf) -> crate::Result<()>;
    /// Whether the routed kernels take experts laid out like `e`.
    fn routed_supports(&self, e: &Self::Expert) -> bool;
    /// out[..hidden] += one token's experts (ascending index order), through the routed
    /// kernels: the same sums as `expert_step` and `add_row` per expert.
    fn experts_routed(
        &self,
        work: &mut Self::Work,
        experts: &[SlotExpert<Self::Expert>],
        x: &Self::Buf,
        out: &mut Self::Buf,
    ) -> crate::Result<()>;
    /// Every expert resident (`experts`: [layer][expert], `shape`: experts a layer and routes a
    /// token) for decode routed on the device; None
    /// where the routed kernels do not take their layout. `gated`: the table is a directory of
    /// the cached experts instead (every expert absent until `gate_update` says otherwise; the
    /// entries given are any slot's, of the right layout), and a decode layer with an absent
    /// expert waits at its gate (gated decode, experts/engine/gated.rs); Some(hidden > 0): with
    /// CPU experts (`gate_x`, `gate_cpu`).
    fn resident(
        &self,
        experts: &[Self::Expert],
        shape: (usize, usize),
        gated: Option<usize>,
    ) -> crate::Result<Option<Self::Resident>>;
    /// Gated decode: queue directory `changes` (table index, the expert now there or None:
    /// absent); with `layer`, after the events `after` (the loads they need) on a stream of
    /// their own, then open that layer's gate; without, between tokens, in order with the
    /// compute stream.
    fn gate_update(
        &self,
        r: &mut Self::Resident,
        changes: &[(usize, Option<Self::Expert>)],
        layer: Option<usize>,
        after: &[&Self::Event],
    ) -> crate::Result<()>;
    /// Gated decode: the next token's routes replayed from a trace (per layer k expert indices
    /// as f32 bits, then k weights) in place of the router's, or (None) the router's again.
    fn gate_replay(&self, r: &mut Self::Resident, routes: Option<&[f32]>) -> crate::Result<()>;
    /// Gated decode: every layer's mailbox emptied, before a token's launches.
    fn gate_reset(&self, r: &mut Self::Resident) -> crate::Result<()>;
    /// Gated decode: layer `layer`'s mailbox: None until the device has routed the layer, then
    /// whether it found an absent expert (and waits at the gate), its routes in `routes` (k
    /// expert indices as f32 bits, then k weights).
    fn gate_mail(
        &self,
        r: &Self::Resident,
        layer: usize,
        routes: &mut [f32],
    ) -> crate::Result<Option<bool>>;
    /// Gated decode with CPU experts: layer `layer`'s input (its normalized x), in its mailbox
    /// once the device has found a miss there.
    fn gate_x(&self, r: &Self::Resident, layer: usize, x: &mut [f32]) -> crate::Result<()>;
    /// Gated decode with CPU experts: before layer `layer`'s gate opens (`gate_update`), its
    /// routes replaced by `routes` (the CPU's experts weighted 0) and the CPU's result `extra`
    /// added to its experts' sum.
    fn gate_cpu(
        &self,
        r: &mut Self::Resident,
        layer: usize,
        routes: &[f32],
        extra: &[f32],
    ) -> crate::Result<()>;
    /// Gated decode after a failure: every gate opened, so that the device's work ends (what it
    /// computes is thrown away); they close again before the next token.
    fn gate_open_all(&self, r: &mut Self::Resident) -> crate::Result<()>;
    /// One decode layer routed on the device (`ExpertExecutor::forward_on_device`'s contract,
    /// `before` called between the routing and the experts): returns whether xs holds the
    /// `next` norm of x.
    fn routed_layer(
        &self,
        r: &Self::Resident,
        layer: usize,
        block: &MoeBlock<'_>,
        xs_x: (&mut Self::Buf, &mut Self::Buf),
        before: BeforeExperts<'_, Self>,
    ) -> crate::Result<bool>;
    /// Queue the read of every layer's routes of the last device-routed token.
    fn queue_routes(&self, r: &mut Self::Resident) -> crate::Result<()>;
    /// The queued routes, once landed: per layer, top_k expert indices (as f32 bits) then
    /// top_k weights.
    fn read_routes<'r>(&self, r: &'r mut Self::Resident) -> crate::Result<&'r [f32]>;
}
