//! The C API on bad input, without a GPU: every call answers with an error code and a message
//! and never crashes. Arguments are checked before the driver is touched, so these hold on a
//! machine with or without one. (`examples/cuda-cpp/capi_test.c` checks the same from C, and
//! more on a GPU.)

use std::ffi::{CStr, c_int};
use std::ptr;

use toga_capi::toga_status::*;
use toga_capi::*;

fn message() -> String {
    // SAFETY: the API returns a valid C string.
    unsafe { CStr::from_ptr(toga_last_error_message()) }
        .to_string_lossy()
        .into_owned()
}

#[test]
fn null_outputs_are_invalid_values() {
    unsafe {
        assert_eq!(toga_device_count(ptr::null_mut()), TOGA_ERROR_INVALID_VALUE);
        assert!(message().contains("`count` is NULL"), "{}", message());
        assert_eq!(
            toga_heap_create(0, 1 << 30, ptr::null_mut(), ptr::null_mut()),
            TOGA_ERROR_INVALID_VALUE
        );
        assert_eq!(
            toga_heap_create_growable(0, ptr::null(), ptr::null_mut(), ptr::null_mut()),
            TOGA_ERROR_INVALID_VALUE
        );
        assert_eq!(
            toga_heap_stats(toga_heap { id: 1 }, ptr::null_mut(), ptr::null_mut()),
            TOGA_ERROR_INVALID_VALUE
        );
        assert_eq!(
            toga_heap_base(toga_heap { id: 1 }, ptr::null_mut()),
            TOGA_ERROR_INVALID_VALUE
        );
    }
}

#[test]
fn unknown_handles_are_invalid_handles() {
    let mut base = ptr::null_mut();
    let mut stats = toga_stats::default();
    for id in [0, 7, u64::MAX] {
        let h = toga_heap { id };
        unsafe {
            assert_eq!(toga_heap_base(h, &mut base), TOGA_ERROR_INVALID_HANDLE);
            let m = message();
            assert!(m.contains("heap"), "{m}");
            assert_eq!(
                toga_heap_stats(h, ptr::null_mut(), &mut stats),
                TOGA_ERROR_INVALID_HANDLE
            );
            assert_eq!(
                toga_heap_trim(h, ptr::null_mut()),
                TOGA_ERROR_INVALID_HANDLE
            );
            assert_eq!(
                toga_heap_trim_to(h, ptr::null_mut(), 0, ptr::null_mut()),
                TOGA_ERROR_INVALID_HANDLE
            );
            assert_eq!(
                toga_heap_grow(h, ptr::null_mut(), 1 << 21, ptr::null_mut()),
                TOGA_ERROR_INVALID_HANDLE
            );
            assert_eq!(
                toga_heap_synchronize(h, ptr::null_mut()),
                TOGA_ERROR_INVALID_HANDLE
            );
            assert_eq!(
                toga_heap_reset(h, ptr::null_mut()),
                TOGA_ERROR_INVALID_HANDLE
            );
            assert_eq!(
                toga_heap_destroy(h, ptr::null_mut()),
                TOGA_ERROR_INVALID_HANDLE
            );
        }
    }
    assert!(base.is_null(), "a failed call wrote its output");
}

#[test]
fn bad_sizes_and_devices_are_refused_before_the_driver() {
    let mut out = toga_heap { id: 0 };
    unsafe {
        assert_eq!(
            toga_heap_create(0, 0, ptr::null_mut(), &mut out),
            TOGA_ERROR_INVALID_SIZE
        );
        assert!(message().contains("greater than zero"), "{}", message());
        assert_eq!(
            toga_heap_create(0, 4096, ptr::null_mut(), &mut out),
            TOGA_ERROR_INVALID_SIZE
        );
        assert_eq!(
            toga_heap_create(0, u64::MAX, ptr::null_mut(), &mut out),
            TOGA_ERROR_TOO_LARGE
        );
        assert_eq!(
            toga_heap_create(-1, 1 << 30, ptr::null_mut(), &mut out),
            TOGA_ERROR_INVALID_DEVICE
        );
        let opts = toga_growable_options {
            flags: 0x80,
            ..Default::default()
        };
        assert_eq!(
            toga_heap_create_growable(0, &opts, ptr::null_mut(), &mut out),
            TOGA_ERROR_INVALID_VALUE
        );
        let opts = toga_growable_options {
            initial_bytes: 1 << 30,
            max_bytes: 1 << 20,
            ..Default::default()
        };
        assert_eq!(
            toga_heap_create_growable(0, &opts, ptr::null_mut(), &mut out),
            TOGA_ERROR_TOO_LARGE
        );
        // A device that no machine has: without a driver, that is what is said instead.
        let s = toga_heap_create(c_int::MAX, 1 << 30, ptr::null_mut(), &mut out);
        assert!(
            [
                TOGA_ERROR_INVALID_DEVICE,
                TOGA_ERROR_NO_DRIVER,
                TOGA_ERROR_NO_DEVICE
            ]
            .contains(&s),
            "{s:?}: {}",
            message()
        );
        assert!(!message().is_empty());
    }
    assert_eq!(out.id, 0, "a failed create wrote a handle");
}

#[test]
fn every_status_has_its_own_words() {
    let words: Vec<String> = (0..=11)
        .chain([-1, 12, c_int::MAX])
        .map(|s| {
            unsafe { CStr::from_ptr(toga_status_string(s)) }
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    let known = &words[..12];
    for (i, w) in known.iter().enumerate() {
        assert!(!known[..i].contains(w), "{w} twice");
    }
    assert_eq!(
        known[TOGA_ERROR_INVALID_HANDLE as usize],
        "invalid heap handle"
    );
    assert!(words[12..].iter().all(|w| w == "unknown status code"));
}

#[test]
fn the_device_ptx_exports_the_c_functions() {
    let ptx = unsafe { CStr::from_ptr(toga_device_ptx()) }
        .to_str()
        .expect("PTX is text");
    assert!(ptx.len() > 10_000, "the PTX ends early (a NUL inside?)");
    for f in [
        "toga_malloc(",
        "toga_free(",
        "toga_calloc(",
        "toga_realloc(",
        "toga_malloc_aligned(",
        "toga_usable_size(",
        "toga_bind(",
        "toga_unbound_mallocs()",
    ] {
        assert!(
            ptx.lines()
                .any(|l| l.starts_with(".visible .func") && l.contains(f)),
            "{f} is not a .visible .func"
        );
    }
    // A `.version` newer than CUDA 13.0's ptxas accepts (9.0) would be fatal for nvcc -dc.
    let version = ptx
        .lines()
        .find_map(|l| l.strip_prefix(".version "))
        .expect("a .version line");
    let (major, minor) = version.trim().split_once('.').expect("major.minor");
    let v: (u32, u32) = (major.parse().unwrap(), minor.parse().unwrap());
    assert!(v <= (9, 0), "PTX ISA {version}");
}
