//! Typed launchers for the workload and baseline kernels of the harness PTX
//! (`kernels/src/entry/workload.rs`), shared by the GPU tests, the `host` harness and the benches.
//!
//! Every launcher enqueues on the given stream and returns at once; read results back with the
//! stream (which synchronizes) or time them with [`time_ms`].

use std::sync::Arc;

use cudarc::driver::{CudaFunction, CudaSlice, CudaStream, LaunchConfig, PushKernelArg, sys};

use toga::{Gpu, Heap, Result, launch_config};

/// Enqueue `kernel` on `stream` over the grid `config` with `args` pushed in order, and return
/// `Ok(())`: the one launcher behind every typed one below, which adds only its kernel's
/// contract (the `SAFETY` comment where it is used). Unsafe to call, like any kernel launch.
macro_rules! launch {
    ($stream:expr, $kernel:expr, $config:expr, [$($arg:expr),* $(,)?]) => {{
        $stream.launch_builder(&$kernel)$(.arg($arg))*.launch($config)?;
        Ok(())
    }};
}

/// The kernels, loaded once.
pub struct Workloads {
    alloc_fill: CudaFunction,
    check_free: CudaFunction,
    malloc: CudaFunction,
    free: CudaFunction,
    malloc_free: CudaFunction,
    cuda_malloc: CudaFunction,
    cuda_free: CudaFunction,
    bump_malloc: CudaFunction,
    vec_push: CudaFunction,
    churn: CudaFunction,
    churn_pairs: CudaFunction,
    cuda_churn_pairs: CudaFunction,
    bump_churn_pairs: CudaFunction,
    heap_probe: CudaFunction,
    malloc_sizes: CudaFunction,
    malloc_serial: CudaFunction,
    cuda_malloc_sizes: CudaFunction,
    /// The grid of `alloc_fill` and `check_free` ([`Workloads::on_grid`]).
    grid: Option<LaunchConfig>,
}

/// What `toga_heap_probe` reports about a quiescent heap.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Probe {
    /// Bytes TBuddy holds as free blocks.
    pub free_bytes: u64,
    /// Whether one block of the tree's largest order could be taken (and was given back).
    pub whole_heap_block: bool,
}

/// The bytes the heap gives a request of `size` (what `HeapStats::used_bytes` counts): its
/// size class up to `MAX_SMALL_SIZE`, a power of two of whole pages above.
pub fn block_bytes(size: u32) -> u64 {
    use toga_kernels::size_class::{MAX_SMALL_SIZE, SizeClass};
    use toga_kernels::ualloc::PAGE_SIZE;
    let size = size.max(1) as usize;
    if size <= MAX_SMALL_SIZE {
        SizeClass::from_size(size).size() as u64
    } else {
        (size.div_ceil(PAGE_SIZE).next_power_of_two() * PAGE_SIZE) as u64
    }
}

/// `n` sizes uniform over `lo..=hi` from a seeded xorshift: the same list on every run.
pub fn uniform_sizes(n: u64, lo: u32, hi: u32, seed: u64) -> Vec<u32> {
    let mut x = seed | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            lo + (x % (hi - lo + 1) as u64) as u32
        })
        .collect()
}

/// The mixed-size workload of `benches/mixed.rs` (scenario `c_mixed`) and of `host bench`'s
/// mixed row: sizes uniform over `MIXED_MIN..=MIXED_MAX` bytes, drawn from [`MIXED_SEED`]
/// ([`mixed_sizes`]), so the two time the same list.
pub const MIXED_MIN: u32 = 16;
/// The largest size of the mixed workload (see [`MIXED_MIN`]).
pub const MIXED_MAX: u32 = 4096;
/// The seed of the mixed workload's list (see [`MIXED_MIN`]).
pub const MIXED_SEED: u64 = 0x9E37_79B9_7F4A_7C15;
const _: () = assert!(0 < MIXED_MIN && MIXED_MIN <= MIXED_MAX);

/// The mixed workload's sizes for `n` threads ([`MIXED_MIN`]): the same list on every run.
pub fn mixed_sizes(n: u64) -> Vec<u32> {
    uniform_sizes(n, MIXED_MIN, MIXED_MAX, MIXED_SEED)
}

/// The mixed workload's range as the CSVs and tables name it: `16-4096`.
pub fn mixed_label() -> String {
    format!("{MIXED_MIN}-{MIXED_MAX}")
}

/// The smallest block the `*_churn_pairs` kernels take: they write its first and last 4-byte
/// words.
pub const CHURN_MIN_SIZE: u32 = 4;

/// What a churn kernel allocates from ([`Workloads::churn_pairs`]).
pub enum Source<'a> {
    /// toga's heap.
    Toga(&'a Heap),
    /// CUDA's device `malloc` and `free`: the context's heap limit must have been raised with
    /// [`crate::open_with_cuda_heap`].
    CudaMalloc,
    /// The bump baseline: offsets from `bump[0]` wrap around the first `ring_bytes` (a power of
    /// two) of `ring`, which has room for one largest block past them; `free` is a no-op.
    Bump {
        /// One word: the next offset.
        bump: &'a mut CudaSlice<u64>,
        /// The memory handed out.
        ring: &'a mut CudaSlice<u8>,
        /// Where offsets wrap.
        ring_bytes: u64,
    },
}

/// One churn launch: `threads` threads, `rounds` rounds each, sizes uniform in `sizes`
/// (inclusive, from `CHURN_MIN_SIZE` up) drawn from `seed`.
#[derive(Clone, Copy, Debug)]
pub struct Churn {
    /// Threads in the launch.
    pub threads: u64,
    /// Rounds per thread, each one `malloc` (and write) and one `free` (and check).
    pub rounds: u32,
    /// Seed of every thread's sizes.
    pub seed: u32,
    /// Smallest and largest size.
    pub sizes: (u32, u32),
}

/// `toga_host_pattern` (toga's own PTX and the harness's): threads `0..n` fill, or with
/// `check` check, the pattern of `(i, tag)` over `sizes[i]` bytes at block `i`, whose address
/// is `ptrs[i]`, or with `indirect` the pointer stored at `ptrs[i]` (a `HostBlock`'s slot).
/// Wrong words are added to `errors[0]` and null blocks to `errors[1]` (two words, zeroed by
/// the caller).
#[allow(clippy::too_many_arguments)]
pub fn host_pattern(
    gpu: &Gpu,
    stream: &Arc<CudaStream>,
    ptrs: &CudaSlice<u64>,
    indirect: bool,
    sizes: &CudaSlice<u64>,
    tag: u32,
    check: bool,
    errors: &mut CudaSlice<u64>,
) -> Result<()> {
    let f = gpu.function("toga_host_pattern")?;
    let n = ptrs.len().min(sizes.len()) as u64;
    let (indirect, check) = (indirect as u32, check as u32);
    // SAFETY: `ptrs` and `sizes` hold `n` words, `errors` two.
    unsafe {
        stream
            .launch_builder(&f)
            .arg(ptrs)
            .arg(&indirect)
            .arg(sizes)
            .arg(&n)
            .arg(&tag)
            .arg(&check)
            .arg(errors)
            .launch(launch_config(n))?;
    }
    Ok(())
}

/// GPU time of the work `f` enqueues on `stream`, by CUDA events, in milliseconds.
pub fn time_ms(stream: &Arc<CudaStream>, f: impl FnOnce() -> Result<()>) -> Result<f32> {
    let flags = Some(sys::CUevent_flags::CU_EVENT_DEFAULT);
    let start = stream.record_event(flags)?;
    f()?;
    let end = stream.record_event(flags)?;
    Ok(start.elapsed_ms(&end)?)
}

impl Workloads {
    /// Load the kernels from `gpu`'s module (toga's own PTX).
    pub fn new(gpu: &Gpu) -> Result<Self> {
        Ok(Self {
            alloc_fill: gpu.function("toga_alloc_fill")?,
            check_free: gpu.function("toga_check_free")?,
            malloc: gpu.function("toga_malloc")?,
            free: gpu.function("toga_free")?,
            malloc_free: gpu.function("toga_malloc_free")?,
            cuda_malloc: gpu.function("cuda_malloc")?,
            cuda_free: gpu.function("cuda_free")?,
            bump_malloc: gpu.function("bump_malloc")?,
            vec_push: gpu.function("toga_vec_push")?,
            churn: gpu.function("toga_churn")?,
            churn_pairs: gpu.function("toga_churn_pairs")?,
            cuda_churn_pairs: gpu.function("cuda_churn_pairs")?,
            bump_churn_pairs: gpu.function("bump_churn_pairs")?,
            heap_probe: gpu.function("toga_heap_probe")?,
            malloc_sizes: gpu.function("toga_malloc_sizes")?,
            malloc_serial: gpu.function("toga_malloc_serial")?,
            cuda_malloc_sizes: gpu.function("cuda_malloc_sizes")?,
            grid: None,
        })
    }

    /// These launchers, but [`alloc_fill`](Self::alloc_fill) and [`check_free`](Self::check_free)
    /// run on the grid `config`, whose thread `t` takes the indices `t, t + grid threads, ...`
    /// (a single block keeps every request on one SM).
    pub fn on_grid(mut self, config: LaunchConfig) -> Self {
        self.grid = Some(config);
        self
    }

    /// The grid for `n` requests: [`on_grid`](Self::on_grid)'s, else one thread each.
    fn grid(&self, n: u64) -> LaunchConfig {
        self.grid.unwrap_or_else(|| launch_config(n))
    }

    /// Thread `i`: `ptrs[i] = malloc(sizes[i])`, filled with the pattern of `(i, tag)`.
    pub fn alloc_fill(
        &self,
        stream: &Arc<CudaStream>,
        heap: &Heap,
        ptrs: &mut CudaSlice<u64>,
        sizes: &CudaSlice<u32>,
        tag: u32,
    ) -> Result<()> {
        let n = ptrs.len().min(sizes.len()) as u64;
        // SAFETY: `ptrs` and `sizes` hold `n` elements; the heap is initialized.
        unsafe {
            launch!(
                stream,
                self.alloc_fill,
                self.grid(n),
                [&heap.base(), ptrs, sizes, &n, &tag]
            )
        }
    }

    /// Thread `i`: check the pattern of `ptrs[i]`, then free it if `free`. Wrong words go to
    /// `errors[0]` (two words, zeroed by the caller).
    #[allow(clippy::too_many_arguments)]
    pub fn check_free(
        &self,
        stream: &Arc<CudaStream>,
        heap: &Heap,
        ptrs: &CudaSlice<u64>,
        sizes: &CudaSlice<u32>,
        tag: u32,
        free: bool,
        errors: &mut CudaSlice<u64>,
    ) -> Result<()> {
        let n = ptrs.len().min(sizes.len()) as u64;
        let free = free as u32;
        // SAFETY: as for `alloc_fill`; `errors` has two words.
        unsafe {
            launch!(
                stream,
                self.check_free,
                self.grid(n),
                [&heap.base(), ptrs, sizes, &n, &tag, &free, errors]
            )
        }
    }

    /// Thread `i`: `ptrs[i] = malloc(size)` and nothing else (the benchmark kernel), from
    /// `heap`, or from CUDA's device `malloc` when `None` (the context's heap limit must have
    /// been raised with [`crate::open_with_cuda_heap`]).
    pub fn malloc(
        &self,
        stream: &Arc<CudaStream>,
        heap: Option<&Heap>,
        ptrs: &mut CudaSlice<u64>,
        size: u32,
    ) -> Result<()> {
        let n = ptrs.len() as u64;
        let config = launch_config(n);
        // SAFETY: `ptrs` has `n` elements.
        unsafe {
            match heap {
                Some(h) => launch!(stream, self.malloc, config, [&h.base(), ptrs, &size, &n]),
                None => launch!(stream, self.cuda_malloc, config, [ptrs, &size, &n]),
            }
        }
    }

    /// Thread `i`: `ptrs[i] = malloc(sizes[i])` (toga) or CUDA's `malloc(sizes[i])`.
    pub fn malloc_sizes(
        &self,
        stream: &Arc<CudaStream>,
        heap: Option<&Heap>,
        ptrs: &mut CudaSlice<u64>,
        sizes: &CudaSlice<u32>,
    ) -> Result<()> {
        let n = ptrs.len().min(sizes.len()) as u64;
        // SAFETY: `ptrs` and `sizes` have `n` elements.
        unsafe {
            match heap {
                Some(h) => launch!(
                    stream,
                    self.malloc_sizes,
                    launch_config(n),
                    [&h.base(), ptrs, sizes, &n]
                ),
                None => launch!(
                    stream,
                    self.cuda_malloc_sizes,
                    launch_config(n),
                    [ptrs, sizes, &n]
                ),
            }
        }
    }

    /// One thread makes `ptrs[i] = malloc(sizes[i])` for every `i`, one call after another
    /// (the latency of a lone caller).
    pub fn malloc_serial(
        &self,
        stream: &Arc<CudaStream>,
        heap: &Heap,
        ptrs: &mut CudaSlice<u64>,
        sizes: &CudaSlice<u32>,
    ) -> Result<()> {
        let n = ptrs.len().min(sizes.len()) as u64;
        // SAFETY: `ptrs` and `sizes` have `n` elements.
        unsafe {
            launch!(
                stream,
                self.malloc_serial,
                launch_config(1),
                [&heap.base(), ptrs, sizes, &n]
            )
        }
    }

    /// Thread `i`: `free(ptrs[i])`, into `heap`, or CUDA's device `free` when `None`.
    pub fn free(
        &self,
        stream: &Arc<CudaStream>,
        heap: Option<&Heap>,
        ptrs: &CudaSlice<u64>,
    ) -> Result<()> {
        let n = ptrs.len() as u64;
        let config = launch_config(n);
        // SAFETY: `ptrs` came from `malloc` on the same allocator (or are foreign on purpose:
        // toga counts those).
        unsafe {
            match heap {
                Some(h) => launch!(stream, self.free, config, [&h.base(), ptrs, &n]),
                None => launch!(stream, self.cuda_free, config, [ptrs, &n]),
            }
        }
    }

    /// `n` threads each `malloc(size)`, write a byte, `free`; nulls counted in `errors[1]`.
    pub fn malloc_free(
        &self,
        stream: &Arc<CudaStream>,
        heap: &Heap,
        n: u64,
        size: u32,
        errors: &mut CudaSlice<u64>,
    ) -> Result<()> {
        // SAFETY: `errors` has two words.
        unsafe {
            launch!(
                stream,
                self.malloc_free,
                launch_config(n),
                [&heap.base(), &size, &n, errors]
            )
        }
    }

    /// Baseline: one `atom.add` per thread on `bump[0]`, handing out 16-byte-rounded pieces of
    /// `arena` (`limit` bytes).
    pub fn bump_malloc(
        &self,
        stream: &Arc<CudaStream>,
        ptrs: &mut CudaSlice<u64>,
        size: u32,
        bump: &mut CudaSlice<u64>,
        arena: u64,
        limit: u64,
    ) -> Result<()> {
        let n = ptrs.len() as u64;
        // SAFETY: `ptrs` has `n` elements, `bump` one.
        unsafe {
            launch!(
                stream,
                self.bump_malloc,
                launch_config(n),
                [ptrs, &size, &n, bump, &arena, &limit]
            )
        }
    }

    /// Thread `i` grows a `Vec<u64>` to `len` elements; `out[i]` gets the checked sum.
    /// The heap must be bound to toga's module ([`Heap::bind`]).
    pub fn vec_push(
        &self,
        stream: &Arc<CudaStream>,
        out: &mut CudaSlice<u64>,
        len: u32,
    ) -> Result<()> {
        let n = out.len() as u64;
        // SAFETY: `out` has `n` elements.
        unsafe { launch!(stream, self.vec_push, launch_config(n), [out, &n, &len]) }
    }

    /// `n` threads churn `rounds` random alloc/free steps of sizes in `[min, max]`;
    /// corrupted patterns to `errors[0]`, failed allocations to `errors[1]`.
    #[allow(clippy::too_many_arguments)]
    pub fn churn(
        &self,
        stream: &Arc<CudaStream>,
        heap: &Heap,
        n: u64,
        rounds: u32,
        seed: u32,
        sizes: (u32, u32),
        errors: &mut CudaSlice<u64>,
    ) -> Result<()> {
        // SAFETY: `errors` has two words.
        unsafe {
            launch!(
                stream,
                self.churn,
                launch_config(n),
                [&heap.base(), &n, &rounds, &seed, &sizes.0, &sizes.1, errors]
            )
        }
    }

    /// `churn.threads` threads each do `churn.rounds` × (`malloc` a size in `churn.sizes` and
    /// write its first and last words, then check and `free` the block of the round before)
    /// with the allocator `from`, so each block is checked when it is freed, a round after it
    /// was written, and a thread holds at most two; words found wrong at `free` go to
    /// `errors[0]`, failed allocations to `errors[1]`.
    pub fn churn_pairs(
        &self,
        stream: &Arc<CudaStream>,
        from: Source<'_>,
        churn: Churn,
        errors: &mut CudaSlice<u64>,
    ) -> Result<()> {
        let Churn {
            threads: n,
            rounds,
            seed,
            sizes: (min, max),
        } = churn;
        assert!(
            CHURN_MIN_SIZE <= min && min <= max && max < u32::MAX,
            "churn sizes {min}..={max} out of range"
        );
        assert!(errors.len() >= 2, "errors has two words");
        let config = launch_config(n);
        // SAFETY: `errors` has two words and the sizes are in the kernels' range (checked
        // above); the bump ring is checked below.
        unsafe {
            match from {
                Source::Toga(heap) => launch!(
                    stream,
                    self.churn_pairs,
                    config,
                    [&heap.base(), &n, &rounds, &seed, &min, &max, errors]
                ),
                Source::CudaMalloc => launch!(
                    stream,
                    self.cuda_churn_pairs,
                    config,
                    [&n, &rounds, &seed, &min, &max, errors]
                ),
                Source::Bump {
                    bump,
                    ring,
                    ring_bytes,
                } => {
                    assert!(
                        ring_bytes.is_power_of_two()
                            && ring.len() as u64 >= ring_bytes + max as u64,
                        "the ring must be a power of two with room for one largest block past its end"
                    );
                    assert!(!bump.is_empty(), "bump has one word");
                    launch!(
                        stream,
                        self.bump_churn_pairs,
                        config,
                        [
                            &n,
                            &rounds,
                            &seed,
                            &min,
                            &max,
                            bump,
                            ring,
                            &ring_bytes,
                            errors
                        ]
                    )
                }
            }
        }
    }

    /// Whole-heap check of a quiescent heap (synchronizes `stream`).
    pub fn probe(&self, stream: &Arc<CudaStream>, heap: &Heap) -> Result<Probe> {
        let mut out = stream.alloc_zeros::<u64>(2)?;
        // SAFETY: `out` has two words; nothing else runs on the heap (caller).
        let launched: Result<()> = unsafe {
            launch!(
                stream,
                self.heap_probe,
                launch_config(1),
                [&heap.base(), &mut out]
            )
        };
        launched?;
        let out = stream.clone_dtoh(&out)?;
        Ok(Probe {
            free_bytes: out[0],
            whole_heap_block: out[1] == 1,
        })
    }
}

/// The allocators the benchmarks compare.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Allocator {
    /// toga's `malloc`.
    Toga,
    /// CUDA's built-in device `malloc`.
    CudaMalloc,
    /// One `atom.add` per thread on one word: the practical ceiling (touches no memory, never
    /// reuses).
    Bump,
}

impl Allocator {
    /// Every allocator, in the order tables show them.
    pub const ALL: [Allocator; 3] = [Allocator::Toga, Allocator::CudaMalloc, Allocator::Bump];

    /// The allocator's name in tables and CSV rows.
    pub fn name(self) -> &'static str {
        match self {
            Allocator::Toga => "toga",
            Allocator::CudaMalloc => "cuda-malloc",
            Allocator::Bump => "bump",
        }
    }
}

/// Heap state before a timed `malloc` kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeapState {
    /// A new heap's first use: `Heap::reset` (the metadata zeroed, the init kernels, the
    /// arenas stocked) and the malloc kernel timed together, as a user's first kernel on a new
    /// heap pays for them. The baselines have nothing to set up: as [`HeapState::Fresh`].
    FirstUse,
    /// Just initialized (`Heap::reset`, not timed).
    Fresh,
    /// After one full malloc/free round of the same size (of the same list, in
    /// [`MallocBench::run_sizes`]), untimed.
    Warm,
}

impl HeapState {
    /// The state's name in tables and CSV rows (the `state` column).
    pub fn name(self) -> &'static str {
        match self {
            HeapState::FirstUse => "first-use",
            HeapState::Fresh => "fresh",
            HeapState::Warm => "warm",
        }
    }
}

/// The header of the benchmark CSVs that `benches/` and `host bench --csv` write and `report`
/// reads (`report/src/input.rs`): one row per timed kernel or per cell median, `rounds` being
/// the operations each thread does in the timed kernel.
pub const CSV_HEADER: &str =
    "scenario,allocator,size,threads,state,metric,iteration,ms,failed,device,rounds";

/// GPU times of one benchmark iteration, in milliseconds.
#[derive(Clone, Copy, Debug, Default)]
pub struct Timing {
    /// The kernel in which every thread calls `malloc` once.
    pub malloc_ms: f32,
    /// The kernel in which every thread frees that block (0 for the bump allocator).
    pub free_ms: f32,
    /// Threads whose `malloc` returned null.
    pub failed: u64,
}

/// The size the bump baseline's kernel asks of every thread in a [`MallocBench::run_sizes`] (its
/// kernel takes one size): the largest of the mixed list ([`MIXED_MAX`]). The bump allocator
/// touches none of the memory it hands out, so the size changes only the offsets' stride.
pub const BUMP_LIST_SIZE: u32 = MIXED_MAX;

/// What the threads of a [`MallocBench`] malloc kernel ask for.
#[derive(Clone, Copy)]
enum Asks<'a> {
    /// Every thread the same size.
    Same(u32),
    /// Thread `i` asks for `sizes[i]`.
    Each(&'a CudaSlice<u32>),
}

impl Asks<'_> {
    /// Enqueue the malloc kernel that asks for these sizes, into `ptrs`: from `heap`, or from
    /// CUDA's device `malloc` when `None`.
    fn malloc(
        self,
        w: &Workloads,
        stream: &Arc<CudaStream>,
        heap: Option<&Heap>,
        ptrs: &mut CudaSlice<u64>,
    ) -> Result<()> {
        match self {
            Asks::Same(size) => w.malloc(stream, heap, ptrs, size),
            Asks::Each(sizes) => w.malloc_sizes(stream, heap, ptrs, sizes),
        }
    }

    /// The one size the bump baseline's kernel asks of every thread.
    fn bump_size(self) -> u32 {
        match self {
            Asks::Same(size) => size,
            Asks::Each(_) => BUMP_LIST_SIZE,
        }
    }
}

/// Runs "every thread mallocs once, then every thread frees" for each allocator.
pub struct MallocBench {
    stream: Arc<CudaStream>,
    heap: Heap,
    w: Workloads,
    ptrs: CudaSlice<u64>,
    bump: CudaSlice<u64>,
}

impl MallocBench {
    /// `threads` threads per kernel over a toga heap of `heap_bytes`. For the CUDA baseline,
    /// `gpu` must have been opened with [`crate::open_with_cuda_heap`] large enough.
    pub fn new(gpu: &Gpu, threads: u64, heap_bytes: u64) -> Result<Self> {
        let stream = gpu.default_stream();
        Ok(Self {
            heap: Heap::new(gpu, &stream, heap_bytes)?,
            w: Workloads::new(gpu)?,
            ptrs: stream.alloc_zeros::<u64>(threads as usize)?,
            bump: stream.alloc_zeros::<u64>(1)?,
            stream,
        })
    }

    /// [`MallocBench::new`] around a heap the caller made (a growable heap, or one built with
    /// other settings), on `gpu` and ordered before `gpu`'s default stream (made on it, say).
    pub fn with_heap(gpu: &Gpu, threads: u64, heap: Heap) -> Result<Self> {
        let stream = gpu.default_stream();
        Ok(Self {
            heap,
            w: Workloads::new(gpu)?,
            ptrs: stream.alloc_zeros::<u64>(threads as usize)?,
            bump: stream.alloc_zeros::<u64>(1)?,
            stream,
        })
    }

    /// Threads per kernel.
    pub fn threads(&self) -> u64 {
        self.ptrs.len() as u64
    }

    /// The toga heap (for statistics).
    pub fn heap(&self) -> &Heap {
        &self.heap
    }

    /// The toga heap, to set it up between iterations (reset, trim, grow) before a
    /// [`MallocBench::run_steady`].
    pub fn heap_mut(&mut self) -> &mut Heap {
        &mut self.heap
    }

    /// One iteration: set up `state`, time the malloc kernel, time the free kernel, every thread
    /// asking for `size`.
    pub fn run(&mut self, alloc: Allocator, size: u32, state: HeapState) -> Result<Timing> {
        self.run_asks(alloc, Asks::Same(size), state)
    }

    /// [`MallocBench::run`] where thread `i` asks for `sizes[i]`: toga (and CUDA's malloc) set up
    /// `state` as for one size, the warm-up round of [`HeapState::Warm`] asking for the same
    /// list; the bump baseline asks for [`BUMP_LIST_SIZE`] in every thread.
    pub fn run_sizes(
        &mut self,
        alloc: Allocator,
        sizes: &CudaSlice<u32>,
        state: HeapState,
    ) -> Result<Timing> {
        self.run_asks(alloc, Asks::Each(sizes), state)
    }

    /// [`MallocBench::run`] and [`MallocBench::run_sizes`]: set up `state`, then the timed
    /// kernels of [`MallocBench::steady`].
    fn run_asks(&mut self, alloc: Allocator, asks: Asks<'_>, state: HeapState) -> Result<Timing> {
        let s = self.stream.clone();
        if alloc == Allocator::Toga && state == HeapState::FirstUse {
            let malloc_ms = time_ms(&s, || {
                self.heap.reset(&s)?;
                asks.malloc(&self.w, &s, Some(&self.heap), &mut self.ptrs)
            })?;
            let failed = self.failed()?;
            let free_ms = time_ms(&s, || self.w.free(&s, Some(&self.heap), &self.ptrs))?;
            return Ok(Timing {
                malloc_ms,
                free_ms,
                failed,
            });
        }
        if alloc == Allocator::Toga {
            self.heap.reset(&s)?;
        }
        // The bump allocator has no state: every iteration starts at offset 0.
        if alloc != Allocator::Bump && state == HeapState::Warm {
            let heap = (alloc == Allocator::Toga).then_some(&self.heap);
            asks.malloc(&self.w, &s, heap, &mut self.ptrs)?;
            self.w.free(&s, heap, &self.ptrs)?;
        }
        self.steady(alloc, asks)
    }

    /// One iteration on the heap as the iterations before it left it, with no reset: time the
    /// malloc kernel, then the free kernel (toga and CUDA's malloc; the bump allocator starts
    /// from offset 0 as in [`MallocBench::run`] and never frees). After a [`MallocBench::run`]
    /// of the same allocator and size, this is a launch on a warm heap: one that has served and
    /// freed this size class before.
    pub fn run_steady(&mut self, alloc: Allocator, size: u32) -> Result<Timing> {
        self.steady(alloc, Asks::Same(size))
    }

    /// [`MallocBench::run_steady`] for any [`Asks`].
    fn steady(&mut self, alloc: Allocator, asks: Asks<'_>) -> Result<Timing> {
        let s = self.stream.clone();
        if alloc == Allocator::Bump {
            let malloc_ms = self.bump(asks.bump_size())?;
            return Ok(Timing {
                malloc_ms,
                free_ms: 0.0,
                failed: self.failed()?,
            });
        }
        let heap = (alloc == Allocator::Toga).then_some(&self.heap);
        let malloc_ms = time_ms(&s, || asks.malloc(&self.w, &s, heap, &mut self.ptrs))?;
        let failed = self.failed()?;
        let free_ms = time_ms(&s, || self.w.free(&s, heap, &self.ptrs))?;
        Ok(Timing {
            malloc_ms,
            free_ms,
            failed,
        })
    }

    /// The bump baseline's malloc kernel from offset 0, timed (ms).
    fn bump(&mut self, size: u32) -> Result<f32> {
        let s = self.stream.clone();
        s.memset_zeros(&mut self.bump)?;
        time_ms(&s, || {
            self.w.bump_malloc(
                &s,
                &mut self.ptrs,
                size,
                &mut self.bump,
                1 << 40,
                u64::MAX >> 1,
            )
        })
    }

    /// One iteration of "one thread mallocs `sizes[i]` for every `i`, in order" on a fresh toga
    /// heap (`sizes` has [`threads`](Self::threads) elements), then the parallel kernel that
    /// frees those blocks.
    pub fn run_serial(&mut self, sizes: &CudaSlice<u32>) -> Result<Timing> {
        let s = self.stream.clone();
        self.heap.reset(&s)?;
        let m = time_ms(&s, || {
            self.w.malloc_serial(&s, &self.heap, &mut self.ptrs, sizes)
        })?;
        let failed = self.failed()?;
        let f = time_ms(&s, || self.w.free(&s, Some(&self.heap), &self.ptrs))?;
        Ok(Timing {
            malloc_ms: m,
            free_ms: f,
            failed,
        })
    }

    /// One iteration of "every thread mallocs `size` and frees it in the same kernel" (toga).
    pub fn run_malloc_free(&mut self, size: u32) -> Result<Timing> {
        let s = self.stream.clone();
        self.heap.reset(&s)?;
        let mut errors = s.alloc_zeros::<u64>(2)?;
        let n = self.threads();
        let m = time_ms(&s, || {
            self.w.malloc_free(&s, &self.heap, n, size, &mut errors)
        })?;
        let failed = s.clone_dtoh(&errors)?[1];
        Ok(Timing {
            malloc_ms: m,
            free_ms: 0.0,
            failed,
        })
    }

    /// The stream the benchmark runs on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    fn failed(&self) -> Result<u64> {
        Ok(self
            .stream
            .clone_dtoh(&self.ptrs)?
            .iter()
            .filter(|&&p| p == 0)
            .count() as u64)
    }
}

/// Bytes of the ring the bump baseline of [`ChurnBench`] hands out (offsets wrap around it): far
/// more than the threads of one launch hold live at once (two blocks each), so a block is not
/// handed out again before its owner checks it, and small enough to keep beside a heap.
pub const BUMP_RING_BYTES: u64 = 256 << 20;

/// GPU time and checks of one churn kernel.
#[derive(Clone, Copy, Debug, Default)]
pub struct ChurnTiming {
    /// The timed kernel: every thread does all its rounds.
    pub ms: f32,
    /// `malloc`s that returned null, in the warm-up round and the timed kernel.
    pub failed: u64,
    /// Words found wrong when their block was freed, in the warm-up round and the timed kernel
    /// (0 unless blocks overlap).
    pub corrupted: u64,
}

/// Runs "every thread does `rounds` × (malloc and write, check and free the block of the round
/// before)" ([`Workloads::churn_pairs`]) for each allocator.
pub struct ChurnBench {
    stream: Arc<CudaStream>,
    heap: Heap,
    w: Workloads,
    threads: u64,
    errors: CudaSlice<u64>,
    bump: CudaSlice<u64>,
    /// The bump baseline's ring ([`BUMP_RING_BYTES`] and room for one block past it), made on
    /// its first run.
    ring: Option<CudaSlice<u8>>,
}

impl ChurnBench {
    /// `threads` threads per kernel over a toga heap of `heap_bytes`. For the CUDA baseline,
    /// `gpu` must have been opened with [`crate::open_with_cuda_heap`] large enough.
    pub fn new(gpu: &Gpu, threads: u64, heap_bytes: u64) -> Result<Self> {
        let stream = gpu.default_stream();
        Ok(Self {
            heap: Heap::new(gpu, &stream, heap_bytes)?,
            w: Workloads::new(gpu)?,
            threads,
            errors: stream.alloc_zeros::<u64>(2)?,
            bump: stream.alloc_zeros::<u64>(1)?,
            ring: None,
            stream,
        })
    }

    /// Threads per kernel.
    pub fn threads(&self) -> u64 {
        self.threads
    }

    /// One iteration of `rounds` rounds with sizes in `sizes` (inclusive), the same sizes for
    /// every allocator (`seed`). toga: reset the heap, warm it with one round of the same kernel
    /// (untimed), time the kernel. CUDA's malloc: a warm-up round, then the timed kernel. Bump:
    /// the timed kernel from offset 0.
    pub fn run(
        &mut self,
        alloc: Allocator,
        rounds: u32,
        seed: u32,
        sizes: (u32, u32),
    ) -> Result<ChurnTiming> {
        let s = self.stream.clone();
        let n = self.threads;
        s.memset_zeros(&mut self.errors)?;
        let churn = |rounds| Churn {
            threads: n,
            rounds,
            seed,
            sizes,
        };
        let errors = &mut self.errors;
        let ms = match alloc {
            Allocator::Toga => {
                self.heap.reset(&s)?;
                let heap = &self.heap;
                self.w
                    .churn_pairs(&s, Source::Toga(heap), churn(1), &mut *errors)?;
                time_ms(&s, || {
                    self.w
                        .churn_pairs(&s, Source::Toga(heap), churn(rounds), errors)
                })?
            }
            Allocator::CudaMalloc => {
                self.w
                    .churn_pairs(&s, Source::CudaMalloc, churn(1), &mut *errors)?;
                time_ms(&s, || {
                    self.w
                        .churn_pairs(&s, Source::CudaMalloc, churn(rounds), errors)
                })?
            }
            Allocator::Bump => {
                let ring_len = (BUMP_RING_BYTES + sizes.1 as u64) as usize;
                if self.ring.as_ref().is_none_or(|r| r.len() < ring_len) {
                    self.ring = Some(s.alloc_zeros::<u8>(ring_len)?);
                }
                let ring = self.ring.as_mut().expect("made above");
                s.memset_zeros(&mut self.bump)?;
                let from = Source::Bump {
                    bump: &mut self.bump,
                    ring,
                    ring_bytes: BUMP_RING_BYTES,
                };
                time_ms(&s, || self.w.churn_pairs(&s, from, churn(rounds), errors))?
            }
        };
        let errors = s.clone_dtoh(&self.errors)?;
        Ok(ChurnTiming {
            ms,
            failed: errors[1],
            corrupted: errors[0],
        })
    }
}

#[cfg(test)]
mod block_bytes_tests {
    use super::block_bytes;

    #[test]
    fn small_sizes_round_to_their_class_and_large_ones_to_pages() {
        assert_eq!(block_bytes(1), 16);
        assert_eq!(block_bytes(16), 16);
        assert_eq!(block_bytes(17), 32);
        assert_eq!(block_bytes(4096), 4096);
        assert_eq!(block_bytes(4097), 8192);
        assert_eq!(block_bytes(12289), 16384);
        assert_eq!(block_bytes(1 << 20), 1 << 20);
    }
}
