//! A model with its KV cache and decode buffers ([`Session`]): the [`CausalLm`] the generation
//! loop drives, with the decode step captured as a CUDA graph and replayed where the runtime
//! and the model allow it.

use cubecl::prelude::*;
use ops::sampling::{RowParams, SamplingInputs, SamplingPlan, SamplingWorkspace};
use ops::{caps, DType, DeviceTensor};

use crate::engine::buffers::DecodeBuffers;
use crate::engine::device_lock;
use crate::engine::kv_cache::KvCache;
use crate::engine::model::{Logits, Model, StepInput};
use crate::engine::projection::Projection;
use crate::error::{ModelError, Result};
use crate::generate::CausalLm;
use crate::sampling::SamplingParams;

/// Where the current logits are.
enum Current<R: Runtime> {
    None,
    Prefill(DeviceTensor<R>),
    Decode,
}

/// A decode step that replays a captured CUDA graph once it can: the first run is eager (it
/// compiles the kernels), the second is captured and later runs replay it. The step must
/// allocate nothing and read its inputs from device buffers written before each run.
pub(crate) enum StepGraph<R: Runtime> {
    /// Eager launches (runtimes without hardware graphs, graphs turned off, block-sparse
    /// projections, or a capture that failed).
    Off,
    Warming {
        steps: usize,
    },
    Ready(cubecl::client::Graph<R>),
}

impl<R: Runtime> StepGraph<R> {
    /// Graphs when `on` and the runtime has them, else eager steps.
    pub fn new(client: &ComputeClient<R>, on: bool) -> Self {
        if on && caps::runtime_name(client) == "cuda" {
            Self::Warming { steps: 0 }
        } else {
            Self::Off
        }
    }

    pub fn ready(&self) -> bool {
        matches!(self, Self::Ready(_))
    }

    /// Whether the next [`Self::run`] captures (the caller then holds the device exclusively).
    pub fn capturing(&self) -> bool {
        matches!(self, Self::Warming { steps } if *steps > 0)
    }

    /// Runs the step whose inputs were just written: eagerly, by capturing it, or by replaying
    /// the capture.
    ///
    /// # Safety
    /// Everything `step` reads and writes must outlive `self` (a replay touches the same
    /// buffers), and run on `client`'s stream.
    pub unsafe fn run(
        &mut self,
        client: &ComputeClient<R>,
        step: impl Fn() -> Result<()>,
    ) -> Result<()> {
        match self {
            Self::Off => step(),
            Self::Ready(graph) => {
                // SAFETY: the caller's contract.
                unsafe { graph.replay() };
                Ok(())
            }
            Self::Warming { steps } if *steps == 0 => {
                *steps += 1;
                step()
            }
            Self::Warming { .. } => {
                // Prepare, run the step for real (its results are this step's), then record the
                // same launches for the following steps. A failure falls back to eager steps.
                client
                    .graph_prepare()
                    .map_err(|e| ModelError::param("graph", format!("{e:?}")))?;
                step()?;
                let captured = client.start_capture().and_then(|_| {
                    let recorded = step();
                    let graph = client.stop_capture();
                    match recorded {
                        Ok(()) => graph,
                        Err(e) => Err(cubecl::server::ServerError::Generic {
                            reason: e.to_string(),
                            backtrace: Default::default(),
                        }),
                    }
                });
                *self = match captured {
                    Ok(graph) => Self::Ready(graph),
                    Err(e) => {
                        eprintln!("note: CUDA graph capture of the decode step failed ({e:?}); decoding eagerly");
                        Self::Off
                    }
                };
                Ok(())
            }
        }
    }
}

/// The cache rows a decode step's attention may be planned for, ascending, the last `max_len`:
/// from the most rows the clustered launch takes (`clustered`; [`FIRST_RUNG`] where the runtime
/// has no clusters) up by factors of [`RUNG_FACTOR`]. A step plans for the smallest rung that
/// holds its context, so its key split spreads at most `RUNG_FACTOR` times its keys over the SMs.
pub(crate) fn plan_rows(clustered: Option<usize>, max_len: usize) -> Vec<usize> {
    let mut rungs = Vec::new();
    let mut rows = clustered.unwrap_or(FIRST_RUNG).max(1);
    while rows < max_len {
        rungs.push(rows);
        rows = rows.saturating_mul(RUNG_FACTOR);
    }
    rungs.push(max_len);
    rungs
}

/// The ratio of consecutive rungs of [`plan_rows`]. Two rather than four: a rung's launch then
/// runs at least half full (above the first rung). Its split over four times the context's keys
/// made the 8-bit formats slower on the H100 at the 1.5B shape: a 4-6k context on a 32k cache,
/// planned for 16 384 rows, decoded W8A8 at 854-870 tok/s against 903-928 planned for 8 192
/// (FP8 888 against 910), while bf16 and W4A16 gained 0.6-1.2% from the larger rung.
const RUNG_FACTOR: usize = 2;

/// The first rung of [`plan_rows`] on runtimes without the clustered decode launch: the
/// clustered rows of sm_90, so that every runtime plans for the same rungs.
const FIRST_RUNG: usize = 1024;

/// The slot of a plan's graph in [`DeviceSampler::graphs`].
fn plan_index(plan: SamplingPlan) -> usize {
    if plan.small_k {
        8
    } else {
        usize::from(plan.top_k) | usize::from(plan.top_p) << 1 | usize::from(plan.penalty) << 2
    }
}

/// How a [`Session`] runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionOptions {
    /// Capture the decode step as a CUDA graph and replay it (CUDA only; models with
    /// block-sparse projections always run eagerly).
    pub cuda_graphs: bool,
    /// Sample on the device ([`CausalLm::sample_on_device`]); off, sampled generations copy the
    /// logits to the host and sample there (the comparison `bench-generate --host-sampling`
    /// makes).
    pub device_sampling: bool,
}

impl Default for SessionOptions {
    fn default() -> Self {
        Self {
            cuda_graphs: true,
            device_sampling: true,
        }
    }
}

/// The device sampler of a session ([`ops::sampling`] for one row), allocated at its first use.
struct DeviceSampler<R: Runtime> {
    /// The decode step's sampling (the presence mark of the step's token, then the draw),
    /// captured as a CUDA graph like the step, one per [`SamplingPlan`] (the launches differ),
    /// and per target: `graphs[plan][0]` draws into `out`, `graphs[plan][1]` into the decode
    /// buffers' input token, for sampling one step ahead of the host
    /// ([`CausalLm::decode_sample_ahead`]). Declared first: dropped before the buffers.
    graphs: [[StepGraph<R>; 2]; 9],
    inputs: SamplingInputs<R>,
    workspace: SamplingWorkspace<R>,
    out: DeviceTensor<R>,
    /// What the parameter buffer holds.
    params: Option<RowParams>,
    /// The context whose distinct tokens the presence mask holds; `None` when unknown (it is
    /// then filled again from the host before a penalised draw).
    marked: Option<Vec<u32>>,
}

impl<R: Runtime> DeviceSampler<R> {
    /// Whether the draw after a decode step with `plan` captures its graph next: the one
    /// writing the next step's input token (`ahead`) or the one writing `out`.
    fn capturing(&self, plan: usize, ahead: bool) -> bool {
        self.graphs[plan][usize::from(ahead)].capturing()
    }

    /// The draw after a decode step, as `plan`'s graph: the presence mark of the step's input
    /// token, then the draw from the step's logits into the next step's input token (`ahead`:
    /// it overwrites the token just marked) or into `out`.
    fn draw_after_step(
        &mut self,
        c: &ComputeClient<R>,
        step: &DecodeBuffers<R>,
        plan: usize,
        ahead: bool,
    ) -> Result<()> {
        let (inputs, workspace) = (&self.inputs, &self.workspace);
        let target = if ahead { &step.token } else { &self.out };
        let draw = || -> Result<()> {
            ops::sampling::mark_and_sample_into(
                c,
                &step.token,
                &step.logits,
                inputs,
                workspace,
                target,
            )?;
            Ok(())
        };
        let graph = &mut self.graphs[plan][usize::from(ahead)];
        // SAFETY: the graph reads and writes only buffers owned by the session (the decode
        // buffers and the sampler's), which live as long as the graph, on the one client's
        // stream.
        unsafe { graph.run(c, draw) }
    }
}

/// A model with its KV cache and decode buffers: what [`crate::Generator`] drives.
///
/// On CUDA the decode step is captured once as a graph (after a first eager step has compiled
/// every kernel) and replayed for every later token: the host then only writes the step's
/// scalars (the token, and the cache's position and length) and launches one graph instead of
/// ~9 kernels per layer. The graph reads the same buffers every time (the decode buffers, the
/// cache, the weights), all owned by the session, so they outlive it.
///
/// Sampled generations draw on the device too ([`CausalLm::sample_on_device`]): the sampler's
/// kernels run on the current logits (after a decode step, as a second captured graph) and the
/// host reads back one id instead of the vocabulary's logits. The repetition penalty's
/// presence mask is filled from the context at the first token and then updated on the device
/// with each step's input token.
///
/// The decode attention's launch is planned for the rows of the cache tensors it is given, not
/// for the length it reads on the device: its key split is sized to spread that many rows over
/// the SMs, and on sm_90 up to 1 024 rows merge their splits inside one thread-block cluster
/// ([`ops::attention::clustered_decode_keys`]). So a step plans its attention for the cache's
/// first rows, the smallest rung that holds its context of 1 024 (the clustered rows where the
/// runtime has them), 2 048, 4 096, 8 192, … up to the whole cache, and each rung has graphs of its
/// own, captured once, the first time a step needs them: a short context on a long cache runs
/// the clustered launch, and a medium one a split whose cubes all have keys.
pub struct Session<R: Runtime> {
    model: Model<R>,
    cache: KvCache<R>,
    step: DecodeBuffers<R>,
    current: Current<R>,
    /// The step's graphs, one per rung of `rungs`.
    graph: Vec<StepGraph<R>>,
    /// The step fed by the previous step's argmax ([`CausalLm::decode_argmax_ahead`]): graphs of
    /// their own, without the embedding kernel (that argmax gathered the row,
    /// [`StepInput::Chosen`]).
    ahead_graph: Vec<StepGraph<R>>,
    /// The cache rows a step's attention is planned for ([`plan_rows`]), ascending; the last is
    /// the whole cache.
    rungs: Vec<usize>,
    options: SessionOptions,
    sampler: Option<DeviceSampler<R>>,
    /// The input token of the last decode step (what the step's presence mark adds).
    last_decoded: Option<u32>,
    /// The last decode step screened its LM head ([`crate::LoadOptions::screen_lm_head`]) and
    /// did not write its logits: they are computed when asked for ([`Self::logits_ready`]).
    logits_unwritten: bool,
    /// Decode steps run with the LM head screened.
    screened_steps: u64,
}

impl<R: Runtime> Session<R> {
    /// A session with the default options (CUDA graphs where they can be used).
    pub fn new(model: Model<R>) -> Result<Self> {
        Self::with_options(model, SessionOptions::default())
    }

    pub fn with_options(model: Model<R>, options: SessionOptions) -> Result<Self> {
        let _device = device_lock::shared();
        let cache = model.new_cache()?;
        let step = model.new_decode_buffers()?;
        // Block-sparse projections run eagerly (see `Projection::graph_safe`).
        let graph_safe = model.projections().all(Projection::graph_safe);
        let clustered = ops::attention::clustered_decode_keys(
            model.client(),
            model.dtype(),
            model.config().head_dim,
        );
        let rungs = plan_rows(clustered, cache.max_len());
        let graphs = || {
            (0..rungs.len())
                .map(|_| StepGraph::new(model.client(), options.cuda_graphs && graph_safe))
                .collect::<Vec<_>>()
        };
        let (graph, ahead_graph) = (graphs(), graphs());
        Ok(Self {
            model,
            cache,
            step,
            current: Current::None,
            graph,
            ahead_graph,
            rungs,
            options,
            sampler: None,
            last_decoded: None,
            logits_unwritten: false,
            screened_steps: 0,
        })
    }

    /// Whether decode steps currently replay a captured graph.
    pub fn uses_graph(&self) -> bool {
        self.graph.iter().any(StepGraph::ready)
    }

    /// The cache rows the next decode step plans its attention for (`None`: all of them), and
    /// the slot of its graphs: the first rung that holds the step's keys (the cache length
    /// after its append).
    fn plan_slot(&self) -> (Option<usize>, usize) {
        let len = self.cache.len();
        let last = self.rungs.len() - 1;
        let slot = self.rungs.iter().position(|&r| len < r).unwrap_or(last);
        let rows = (slot < last).then_some(self.rungs[slot]);
        (rows, slot)
    }

    /// Whether the decode steps' device sampling with the parameters written last replays a
    /// captured graph: the draw after a step, or the draw one step ahead of the host.
    pub fn sampling_uses_graph(&self) -> bool {
        self.sampler.as_ref().is_some_and(|s| {
            s.graphs[plan_index(s.inputs.plan())]
                .iter()
                .any(StepGraph::ready)
        })
    }

    /// The graph a decode step of `plan` ([`Self::plan_slot`]) runs with: the step fed by the
    /// previous step's argmax (`on_argmax`) or by the token written to `step.token`.
    fn step_graph(&self, on_argmax: bool, (_, slot): (Option<usize>, usize)) -> &StepGraph<R> {
        if on_argmax {
            &self.ahead_graph[slot]
        } else {
            &self.graph[slot]
        }
    }

    /// Runs the decode step whose inputs were just written, planned as `plan`
    /// ([`Self::plan_slot`]), on the previous step's argmax (`on_argmax`: its id's embedding
    /// row, which that argmax gathered) or on `step.token`: eagerly, by capturing it, or by
    /// replaying the capture.
    fn run_step(&mut self, on_argmax: bool, (rows, slot): (Option<usize>, usize)) -> Result<()> {
        let c = self.model.client().clone();
        let (model, cache, step) = (&self.model, &self.cache, &self.step);
        let (graph, input) = if on_argmax {
            (&mut self.ahead_graph[slot], StepInput::Chosen)
        } else {
            (&mut self.graph[slot], StepInput::Token)
        };
        // SAFETY: the graph reads and writes only buffers owned by this session (weights, cache,
        // decode buffers), which live as long as the graph, and everything runs on the one
        // client's stream.
        let run = unsafe { graph.run(&c, || model.decode_step_reading(cache, step, input, rows)) };
        // Only a step on the argmax screens its head (`Model::decode_step_reading`).
        self.logits_unwritten = on_argmax && model.screens_lm_head() && step.screen.is_some();
        self.screened_steps += self.logits_unwritten as u64;
        if run.is_err() {
            // Part of the step may have run (its embedding, say) without its argmax: the input
            // row and the chosen id no longer agree, so no step may run on them.
            self.current = Current::None;
        }
        run
    }

    /// Writes a draw's parameters (when they changed) and uniform `u`, and brings the
    /// repetition penalty's presence mask to `context`: after a decode step (`decode`) the
    /// draw's graph marks the step's input token on the device, so the mask is current when it
    /// held the context up to that token; otherwise it is filled from the host.
    fn prepare_draw(
        &mut self,
        c: &ComputeClient<R>,
        row: RowParams,
        context: &[u32],
        u: f64,
        decode: bool,
    ) -> Result<()> {
        let last_decoded = self.last_decoded;
        let sampler = self.sampler()?;
        if sampler.params != Some(row) {
            sampler.inputs.write_params(c, &[row])?;
            sampler.params = Some(row);
        }
        sampler.inputs.write_uniforms(c, &[u])?;
        if row.repetition_penalty == 1.0 {
            // The mask is unused (and the steps' marks no longer follow a context).
            sampler.marked = None;
            return Ok(());
        }
        let current = decode
            && sampler.marked.as_ref().is_some_and(|m| {
                context.len() == m.len() + 1
                    && context.starts_with(m)
                    && context.last().copied() == last_decoded
            });
        if current {
            if let Some(m) = sampler.marked.as_mut() {
                m.push(context[context.len() - 1]);
            }
        } else {
            sampler.inputs.fill_presence(c, &[context])?;
            sampler.marked = Some(context.to_vec());
        }
        Ok(())
    }

    /// Whether a step ahead can run: a decode step ran last (its choice is on the device) and
    /// the cache has room for one more position.
    fn can_step_ahead(&self) -> bool {
        matches!(self.current, Current::Decode) && self.cache.len() < self.cache.max_len()
    }

    /// The end of a step ahead of the host: queues the read of the id the step runs on (the
    /// argmax in `next_token` when `argmax`, else the draw in `token`), begins the cache's append
    /// of one position, launches the step (`launch`), and only then waits for the id.
    fn launch_ahead(
        &mut self,
        c: &ComputeClient<R>,
        argmax: bool,
        launch: impl FnOnce(&mut Self) -> Result<()>,
    ) -> Result<Option<u32>> {
        // The argmax's id is read from its slot of the length's parity, not from `next_token`:
        // the step launched below writes `next_token` and the other slot, and the step after it,
        // which writes this slot again, is launched only once this read has been waited for.
        // (A small read may be copied on a stream of its own, unordered with later work.) The
        // draw in `token` is written again only by the next call's draw, after the wait.
        let source = if argmax {
            &self.step.chosen[self.cache.len() % 2]
        } else {
            &self.step.token
        };
        let chosen = source.read_queued(c)?;
        self.cache.begin_append(c, 1)?;
        launch(self)?;
        self.cache.commit_step()?;
        let token = chosen.wait::<u32>()?[0];
        if token as usize >= self.model.config().vocab_size {
            return Err(ModelError::BadLogits {
                step: self.cache.len() - 1,
                detail: if argmax {
                    format!("the device argmax chose {token}, outside the vocabulary")
                } else {
                    "no candidate to sample (every logit is NaN or -inf)".into()
                },
            });
        }
        self.last_decoded = Some(token);
        Ok(Some(token))
    }

    /// Computes the last decode step's logits where it screened its LM head and did not write
    /// them (one product of the float head, eager).
    fn logits_ready(&mut self) -> Result<()> {
        if self.logits_unwritten && matches!(self.current, Current::Decode) {
            self.model.fill_step_logits(&self.step)?;
        }
        self.logits_unwritten = false;
        Ok(())
    }

    /// The device sampler, allocated on first use.
    fn sampler(&mut self) -> Result<&mut DeviceSampler<R>> {
        if self.sampler.is_none() {
            let c = self.model.client();
            let vocab = self.model.config().vocab_size;
            let graphs = std::array::from_fn(|_| {
                std::array::from_fn(|_| StepGraph::new(c, self.options.cuda_graphs))
            });
            self.sampler = Some(DeviceSampler {
                graphs,
                inputs: SamplingInputs::new(c, 1, vocab)?,
                workspace: SamplingWorkspace::new(c, 1, vocab)?,
                out: DeviceTensor::empty(c, &[1], DType::U32),
                params: None,
                marked: None,
            });
        }
        Ok(self.sampler.as_mut().expect("allocated above"))
    }

    pub fn model(&self) -> &Model<R> {
        &self.model
    }

    /// With a screened LM head ([`crate::LoadOptions::screen_lm_head`]): the decode steps that
    /// screened it so far and the vocabulary rows they computed again from the float head
    /// (modulo 2^32), read back (a sync); `None` without one.
    pub fn screen_stats(&self) -> Result<Option<(u64, u32)>> {
        let Some(screen) = &self.step.screen else {
            return Ok(None);
        };
        let _device = device_lock::shared();
        let rows = screen.scratch.rows_rescored(self.model.client())?;
        Ok(Some((self.screened_steps, rows)))
    }

    pub fn cache(&self) -> &KvCache<R> {
        &self.cache
    }

    pub fn into_model(self) -> Model<R> {
        self.model
    }

    /// Prefill returning every position's logits (for comparisons with a reference).
    pub fn prefill_all_logits(&mut self, tokens: &[u32]) -> Result<DeviceTensor<R>> {
        let _device = device_lock::shared();
        let logits = self.model.prefill(tokens, &mut self.cache, Logits::All)?;
        self.current = Current::None;
        Ok(logits)
    }
}

impl<R: Runtime> CausalLm for Session<R> {
    fn vocab_size(&self) -> usize {
        self.model.config().vocab_size
    }

    fn max_len(&self) -> usize {
        self.cache.max_len()
    }

    fn len(&self) -> usize {
        self.cache.len()
    }

    fn reset(&mut self) -> Result<()> {
        self.current = Current::None;
        self.cache.reset();
        Ok(())
    }

    fn truncate(&mut self, len: usize) -> Result<bool> {
        self.current = Current::None;
        self.cache.truncate(len);
        Ok(true)
    }

    fn prefill(&mut self, tokens: &[u32]) -> Result<()> {
        let _device = device_lock::shared();
        let logits = self.model.prefill(tokens, &mut self.cache, Logits::Last)?;
        self.current = Current::Prefill(logits);
        Ok(())
    }

    fn decode(&mut self, token: u32) -> Result<()> {
        if token as usize >= self.model.config().vocab_size {
            return Err(ModelError::param(
                "token",
                format!(
                    "{token} is outside the vocabulary of {}",
                    self.model.config().vocab_size
                ),
            ));
        }
        // The step that captures keeps every other session's device work out of the window.
        let plan = self.plan_slot();
        let _device = device_lock::for_step(self.step_graph(false, plan).capturing());
        self.cache.begin_append(self.model.client(), 1)?;
        self.step.write_token(self.model.client(), token)?;
        self.run_step(false, plan)?;
        self.cache.commit_step()?;
        self.current = Current::Decode;
        self.last_decoded = Some(token);
        Ok(())
    }

    fn decode_argmax_ahead(&mut self) -> Result<Option<u32>> {
        if !self.can_step_ahead() {
            return Ok(None);
        }
        let c = self.model.client().clone();
        let plan = self.plan_slot();
        let _device = device_lock::for_step(self.step_graph(true, plan).capturing());
        // The id is read before the step, which overwrites it: the previous step's choice.
        self.launch_ahead(&c, true, |s| s.run_step(true, plan))
    }

    fn decode_sample_ahead(
        &mut self,
        params: &SamplingParams,
        context: &[u32],
        u: f64,
    ) -> Result<Option<u32>> {
        if !self.options.device_sampling || !self.can_step_ahead() {
            return Ok(None);
        }
        let c = self.model.client().clone();
        let row = params.row_params();
        let vocab = self.model.config().vocab_size;
        let plan = plan_index(SamplingPlan::for_params(&[row], vocab));
        let step_plan = self.plan_slot();
        let capturing = self.step_graph(false, step_plan).capturing()
            || self
                .sampler
                .as_ref()
                .is_some_and(|s| s.capturing(plan, true));
        let _device = device_lock::for_step(capturing);
        self.logits_ready()?;
        self.prepare_draw(&c, row, context, u, true)?;
        let sampler = self.sampler.as_mut().expect("allocated above");
        sampler.draw_after_step(&c, &self.step, plan, true)?;
        // The step runs on the draw, which it does not overwrite.
        self.launch_ahead(&c, false, |s| s.run_step(false, step_plan))
    }

    fn argmax(&mut self) -> Result<u32> {
        let _device = device_lock::shared();
        let c = self.model.client();
        let ids = match &self.current {
            // The decode step already ran the device argmax: read back one u32.
            Current::Decode => self.step.next_token.to_vec::<u32>(c)?,
            Current::Prefill(t) => ops::argmax::argmax(c, t)?.to_vec::<u32>(c)?,
            Current::None => {
                return Err(ModelError::param("argmax", "no forward pass has run yet"))
            }
        };
        ids.last().copied().ok_or(ModelError::BadLogits {
            step: self.cache.len(),
            detail: "empty logits".into(),
        })
    }

    fn sample_on_device(
        &mut self,
        params: &SamplingParams,
        context: &[u32],
        u: f64,
    ) -> Result<Option<u32>> {
        if !self.options.device_sampling {
            return Ok(None);
        }
        let decode = match &self.current {
            Current::Prefill(_) => false,
            Current::Decode => true,
            Current::None => {
                return Err(ModelError::param("sample", "no forward pass has run yet"))
            }
        };
        if decode {
            let _device = device_lock::shared();
            self.logits_ready()?;
        }
        let vocab = self.model.config().vocab_size;
        let c = self.model.client().clone();
        let row = params.row_params();
        let plan = plan_index(SamplingPlan::for_params(&[row], vocab));
        let capturing = decode
            && self
                .sampler
                .as_ref()
                .is_some_and(|s| s.capturing(plan, false));
        // A capture keeps every other session's device work out of its window.
        let _device = device_lock::for_step(capturing);
        self.prepare_draw(&c, row, context, u, decode)?;
        let sampler = self.sampler.as_mut().expect("allocated above");
        match &self.current {
            Current::Prefill(logits) => {
                let (inputs, workspace) = (&sampler.inputs, &sampler.workspace);
                ops::sampling::sample_into(&c, logits, inputs, workspace, &sampler.out)?;
            }
            _ => sampler.draw_after_step(&c, &self.step, plan, false)?,
        }
        let token = sampler.out.to_vec::<u32>(&c)?[0];
        if token as usize >= vocab {
            return Err(ModelError::BadLogits {
                step: self.cache.len(),
                detail: "no candidate to sample (every logit is NaN or -inf)".into(),
            });
        }
        Ok(Some(token))
    }

    fn logits(&mut self, out: &mut Vec<f32>) -> Result<()> {
        {
            let _device = device_lock::shared();
            self.logits_ready()?;
        }
        let tensor = match &self.current {
            Current::Prefill(t) => t,
            Current::Decode => &self.step.logits,
            Current::None => {
                return Err(ModelError::param("logits", "no forward pass has run yet"))
            }
        };
        let _device = device_lock::shared();
        *out = tensor.to_f32_vec(self.model.client())?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::plan_rows;

    #[test]
    fn rungs_double_from_the_clustered_rows_to_the_cache() {
        assert_eq!(plan_rows(Some(1024), 704), vec![704]);
        assert_eq!(plan_rows(Some(1024), 1024), vec![1024]);
        assert_eq!(plan_rows(Some(1024), 1025), vec![1024, 1025]);
        assert_eq!(plan_rows(Some(1024), 4096), vec![1024, 2048, 4096]);
        assert_eq!(
            plan_rows(Some(1024), 32768),
            vec![1024, 2048, 4096, 8192, 16384, 32768]
        );
        assert_eq!(plan_rows(None, 5000), vec![1024, 2048, 4096, 5000]);
        assert_eq!(plan_rows(Some(512), 600), vec![512, 600]);
    }
}
