pub const KERNELS_PTX: &str = include_str!(env!("TOGA_KERNELS_PTX"));
