//! One GPU: a CUDA context on device N with toga's kernels loaded.

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaStream, PushKernelArg, sys};
use cudarc::nvrtc::Ptx;

use crate::error::{Error, Result};

/// What the host knows about the device.
#[derive(Clone, Debug)]
pub struct DeviceInfo {
    /// The device's ordinal (0 is the first).
    pub ordinal: usize,
    /// The device's name, as the driver gives it.
    pub name: String,
    /// Streaming multiprocessors.
    pub sm_count: u32,
    /// The bound of the SM ids kernels see (`%nsmid`); at least `sm_count`, and more where the
    /// ids have gaps. A heap gives every SM id an arena of its own. `sm_count` when the loaded
    /// module lacks the probe kernel.
    pub sm_id_bound: u32,
    /// Compute capability, major and minor (9.0 for Hopper).
    pub compute_capability: (i32, i32),
    /// Device memory in bytes.
    pub total_memory: u64,
    /// Free device memory in bytes when the context was opened.
    pub free_memory: u64,
    /// The driver's CUDA version, as `cuDriverGetVersion` gives it (13000 for 13.0).
    pub driver_version: i32,
}

/// A context on one device with a PTX module loaded (toga's own, or a user's kernel crate).
pub struct Gpu {
    ctx: Arc<CudaContext>,
    module: Arc<CudaModule>,
    info: DeviceInfo,
}

/// The primary CUDA context of device `ordinal`, after checking that there is a driver and
/// such a device. For callers that set the context up (limits) before loading a module with
/// [`Gpu::with_context`]; [`Gpu::open_with`] is this plus the load.
pub fn context(ordinal: usize) -> Result<Arc<CudaContext>> {
    let count = device_count()?;
    if count == 0 {
        return Err(Error::NoDevice("the driver reports 0 devices".into()));
    }
    if ordinal >= count {
        return Err(Error::DeviceOutOfRange { ordinal, count });
    }
    Ok(CudaContext::new(ordinal)?)
}

/// Check that a driver is present and return the number of devices.
pub fn device_count() -> Result<usize> {
    // SAFETY: only tries to dlopen libcuda; no CUDA call is made.
    if !unsafe { sys::is_culib_present() } {
        return Err(Error::NoDriver);
    }
    match CudaContext::device_count() {
        Ok(n) => Ok(n.max(0) as usize),
        Err(e) => Err(Error::NoDevice(e.to_string())),
    }
}

impl Gpu {
    /// Open device `ordinal` and load toga's kernels ([`crate::KERNELS_PTX`]: the allocator and
    /// the kernels that manage heaps).
    pub fn open(ordinal: usize) -> Result<Self> {
        Self::open_with(ordinal, crate::KERNELS_PTX)
    }

    /// Open device `ordinal` and load `ptx`: a user's kernel crate built with
    /// `toga_builder::Builder`, which links toga's allocator in.
    pub fn open_with(ordinal: usize, ptx: &str) -> Result<Self> {
        Self::with_context(context(ordinal)?, ptx)
    }

    /// Load `ptx` into a context the caller already has (for example one whose limits it set
    /// before any module loaded). toga's heaps and kernels then share that context.
    pub fn with_context(ctx: Arc<CudaContext>, ptx: &str) -> Result<Self> {
        Self::with_image(ctx, Ptx::from_src(ptx))
    }

    /// [`Gpu::with_context`] for any image the driver loads: PTX text (`Ptx::from_src`), which
    /// it compiles for the device first, or a cubin already compiled for it
    /// (`Ptx::from_binary`), which skips that compilation.
    pub fn with_image(ctx: Arc<CudaContext>, image: Ptx) -> Result<Self> {
        let module = ctx.load_module(image)?;
        let attr = |a| ctx.attribute(a);
        use sys::CUdevice_attribute as A;
        let sm_count = attr(A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)? as u32;
        let sm_id_bound = sm_id_bound(&ctx, &module)?
            .unwrap_or(sm_count)
            .max(sm_count);
        let (free, total) = ctx.mem_get_info()?;
        let info = DeviceInfo {
            ordinal: ctx.ordinal(),
            name: ctx.name()?,
            sm_count,
            sm_id_bound,
            compute_capability: (
                attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
                attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
            ),
            total_memory: total as u64,
            free_memory: free as u64,
            driver_version: driver_version(),
        };
        Ok(Self { ctx, module, info })
    }

    /// The device this context is on.
    pub fn info(&self) -> &DeviceInfo {
        &self.info
    }

    /// Free device memory right now.
    pub fn free_memory(&self) -> Result<u64> {
        Ok(self.ctx.mem_get_info()?.0 as u64)
    }

    /// The CUDA context.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// The loaded module.
    pub fn module(&self) -> &Arc<CudaModule> {
        &self.module
    }

    /// A kernel of the loaded module by name.
    pub fn function(&self, name: &str) -> Result<CudaFunction> {
        Ok(self.module.load_function(name)?)
    }

    /// The context's default stream.
    pub fn default_stream(&self) -> Arc<CudaStream> {
        self.ctx.default_stream()
    }

    /// A new non-default stream.
    pub fn new_stream(&self) -> Result<Arc<CudaStream>> {
        Ok(self.ctx.new_stream()?)
    }
}

/// `%nsmid`, read by one thread of the module's `toga_sm_id_bound` kernel; `None` when the
/// module has no such kernel (a PTX file from before it existed).
fn sm_id_bound(ctx: &Arc<CudaContext>, module: &Arc<CudaModule>) -> Result<Option<u32>> {
    let Ok(f) = module.load_function("toga_sm_id_bound") else {
        return Ok(None);
    };
    let stream = ctx.default_stream();
    let mut out = stream.alloc_zeros::<u32>(1)?;
    // SAFETY: the kernel writes one u32 through its argument.
    unsafe {
        stream
            .launch_builder(&f)
            .arg(&mut out)
            .launch(crate::launch_config(1))?;
    }
    Ok(stream.clone_dtoh(&out)?.first().copied())
}

fn driver_version() -> i32 {
    let mut v = 0;
    // SAFETY: writes one int.
    let _ = unsafe { sys::cuDriverGetVersion(&mut v) };
    v
}
