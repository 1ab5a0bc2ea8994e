//! A growable heap shared between two processes on one GPU (ignored without
//! `--include-ignored`). The test binary runs itself as the second process: with
//! `TOGA_IPC_ROLE` set, a test plays that role instead of its own.
//!
//! - `two_processes_share_a_heap`: the owner allocates and fills blocks, exports the heap over
//!   a Unix socket; the importer maps it, checks the blocks, writes its own pattern, and is
//!   refused when it tries to allocate; the owner checks what it wrote and frees the blocks.
//! - `an_import_from_an_exited_process_is_refused`: the exporter exits before the import.
//! - `an_import_of_what_is_not_a_toga_heap_is_refused`: bad descriptors, in one process.

mod common;

use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Arc;

use cudarc::driver::CudaStream;
use toga::{Error, Gpu, Heap, ImportedHeap, IpcDescriptor, recv_export, send_export};

const ROLE: &str = "TOGA_IPC_ROLE";
const SOCKET: &str = "TOGA_IPC_SOCKET";
const N: usize = 1 << 12;

fn sizes() -> Vec<u64> {
    (0..N as u64).map(|i| 16 + (i * 97) % 8192).collect()
}

fn socket_path(test: &str) -> PathBuf {
    std::env::temp_dir().join(format!("toga-ipc-{}-{test}.sock", std::process::id()))
}

/// Run this test binary as the second process, playing `role` for test `test`.
fn spawn(test: &str, role: &str, socket: &PathBuf) -> std::process::Child {
    Command::new(std::env::current_exe().unwrap())
        .args([test, "--exact", "--include-ignored", "--nocapture"])
        .env(ROLE, role)
        .env(SOCKET, socket)
        .stdout(Stdio::inherit())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap()
}

fn exportable_heap(gpu: &Gpu, stream: &Arc<CudaStream>) -> Option<Heap> {
    // The mapping must stay put while exported: initial size = maximum, no growth, no trim.
    let heap = Heap::growable()
        .initial_bytes(256 << 20)
        .max_bytes(256 << 20)
        .release_threshold(256 << 20)
        .grow_in_kernel(false)
        .ipc_exportable(true)
        .create(gpu, stream)
        .unwrap();
    if !heap.is_growable() {
        println!("SKIP: no virtual memory management on this device: nothing to export");
        return None;
    }
    Some(heap)
}

/// The importer: map the heap, check the owner's pattern, write its own, try to allocate.
fn importer(socket: &str) {
    let gpu = common::gpu();
    let stream = gpu.new_stream().unwrap();
    let mut sock = UnixStream::connect(socket).unwrap();
    let (descriptor, fds) = recv_export(&mut sock).unwrap();
    let heap = ImportedHeap::import(&gpu, &descriptor, fds).unwrap();
    let mut words = vec![0u8; N * 8];
    std::io::Read::read_exact(&mut sock, &mut words).unwrap();
    let owner_ptrs: Vec<u64> = words
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
        .collect();
    let local: Vec<u64> = owner_ptrs
        .iter()
        .map(|&p| heap.translate(p).unwrap())
        .collect();
    let d_ptrs = stream.clone_htod(&local).unwrap();
    let d_sizes = stream.clone_htod(&sizes()).unwrap();
    assert_eq!(
        common::host_pattern(&gpu, &stream, &d_ptrs, false, &d_sizes, 1, true),
        [0, 0],
        "the importer reads the owner's blocks"
    );
    assert_eq!(
        common::host_pattern(&gpu, &stream, &d_ptrs, false, &d_sizes, 2, false),
        [0, 0]
    );
    stream.synchronize().unwrap();
    match heap.alloc_async(64, &stream) {
        Err(e @ Error::ImportedHeap(_)) => println!("importer: {e}"),
        other => panic!("an importer allocated: {other:?}"),
    }
    assert!(matches!(
        heap.free_async(owner_ptrs[0], &stream),
        Err(Error::ImportedHeap(_))
    ));
    println!(
        "importer (pid {}): mapped the heap of pid {} at {:#x} (owner's base {:#x}), checked and rewrote {N} blocks",
        std::process::id(),
        descriptor.pid(),
        heap.base(),
        descriptor.base()
    );
    std::io::Write::write_all(&mut sock, &[1]).unwrap();
}

#[test]
#[ignore = "needs a CUDA GPU: cargo test -- --include-ignored"]
fn two_processes_share_a_heap() {
    match std::env::var(ROLE).as_deref() {
        Ok("importer") => return importer(&std::env::var(SOCKET).unwrap()),
        Ok(_) => return,
        Err(_) => {}
    }
    let gpu = common::gpu();
    let stream = gpu.default_stream();
    let Some(heap) = exportable_heap(&gpu, &stream) else {
        return;
    };
    let d_sizes = stream.clone_htod(&sizes()).unwrap();
    let mut ptrs = stream.alloc_zeros::<u64>(N).unwrap();
    heap.alloc_async_batch(&d_sizes, &mut ptrs, &stream)
        .unwrap();
    assert_eq!(
        common::host_pattern(&gpu, &stream, &ptrs, false, &d_sizes, 1, false),
        [0, 0]
    );
    let export = heap.export_ipc().unwrap();
    let path = socket_path("share");
    let _ = std::fs::remove_file(&path);
    let listener = UnixListener::bind(&path).unwrap();
    let mut child = spawn("two_processes_share_a_heap", "importer", &path);
    let (mut sock, _) = listener.accept().unwrap();
    send_export(&mut sock, &export).unwrap();
    let words: Vec<u8> = stream
        .clone_dtoh(&ptrs)
        .unwrap()
        .iter()
        .flat_map(|p| p.to_le_bytes())
        .collect();
    std::io::Write::write_all(&mut sock, &words).unwrap();
    let mut done = [0u8; 1];
    std::io::Read::read_exact(&mut sock, &mut done).unwrap();
    let status = child.wait().unwrap();
    let _ = std::fs::remove_file(&path);
    assert!(status.success(), "the importer failed: {status}");
    assert_eq!(
        common::host_pattern(&gpu, &stream, &ptrs, false, &d_sizes, 2, true),
        [0, 0],
        "the owner reads what the importer wrote"
    );
    heap.free_async_batch(&mut ptrs, &stream).unwrap();
    let s = heap.stats(&stream).unwrap();
    assert_eq!(
        (s.mallocs, s.frees, s.live_blocks()),
        (N as u64, N as u64, 0)
    );
    println!(
        "owner (pid {}): {N} blocks shared with another process, its writes read back, all freed",
        std::process::id()
    );
}

#[test]
#[ignore = "needs a CUDA GPU: cargo test -- --include-ignored"]
fn an_import_from_an_exited_process_is_refused() {
    match std::env::var(ROLE).as_deref() {
        Ok("exporter") => {
            // Export, send, and exit.
            let gpu = common::gpu();
            let stream = gpu.default_stream();
            let heap = exportable_heap(&gpu, &stream).expect("the parent checked VMM");
            let export = heap.export_ipc().unwrap();
            let mut sock = UnixStream::connect(std::env::var(SOCKET).unwrap()).unwrap();
            send_export(&mut sock, &export).unwrap();
            return;
        }
        Ok(_) => return,
        Err(_) => {}
    }
    let gpu = common::gpu();
    if exportable_heap(&gpu, &gpu.default_stream()).is_none() {
        return;
    }
    let path = socket_path("exited");
    let _ = std::fs::remove_file(&path);
    let listener = UnixListener::bind(&path).unwrap();
    let mut child = spawn(
        "an_import_from_an_exited_process_is_refused",
        "exporter",
        &path,
    );
    let (mut sock, _) = listener.accept().unwrap();
    let (descriptor, fds) = recv_export(&mut sock).unwrap();
    assert!(child.wait().unwrap().success());
    let _ = std::fs::remove_file(&path);
    match ImportedHeap::import(&gpu, &descriptor, fds) {
        Err(e @ Error::Ipc(_)) => println!("{e}"),
        Err(e) => panic!("import after the exporter exited: {e}"),
        Ok(_) => panic!("imported the heap of an exited process"),
    }
    // Nothing more comes from a process that has gone.
    match recv_export(&mut sock) {
        Err(e @ Error::Ipc(_)) => println!("{e}"),
        other => panic!("receive from an exited process: {other:?}"),
    }
}

#[test]
#[ignore = "needs a CUDA GPU: cargo test -- --include-ignored"]
fn an_import_of_what_is_not_a_toga_heap_is_refused() {
    if std::env::var(ROLE).is_ok() {
        return;
    }
    let gpu = common::gpu();
    let stream = gpu.default_stream();
    let Some(heap) = exportable_heap(&gpu, &stream) else {
        return;
    };
    match IpcDescriptor::from_bytes(b"not a heap descriptor, but 64 bytes long ..................")
    {
        Err(e @ Error::Ipc(_)) => println!("{e}"),
        other => panic!("a descriptor from garbage: {other:?}"),
    }
    // A fixed heap, and a growable one made without the option, cannot be exported.
    let fixed = Heap::new(&gpu, &stream, 8 << 20).unwrap();
    assert!(matches!(fixed.export_ipc(), Err(Error::Ipc(_))));
    let plain = Heap::growable().create(&gpu, &stream).unwrap();
    assert!(matches!(plain.export_ipc(), Err(Error::Ipc(_))));
    // The descriptors of the data granules where the metadata's should be: the memory mapped
    // first holds no heap header.
    let export = heap.export_ipc().unwrap();
    let mut fds = export.fds;
    assert!(fds.len() >= 2, "metadata and at least one granule");
    fds.rotate_left(1);
    match ImportedHeap::import(&gpu, &export.descriptor, fds) {
        Err(e @ Error::Ipc(_)) => println!("{e}"),
        Err(e) => panic!("import of rotated descriptors: {e}"),
        Ok(_) => panic!("imported memory that holds no heap header"),
    }
    // Too few descriptors.
    let export = heap.export_ipc().unwrap();
    let mut fds = export.fds;
    fds.pop();
    assert!(matches!(
        ImportedHeap::import(&gpu, &export.descriptor, fds),
        Err(Error::Ipc(_))
    ));
    // And the real thing, in this process, with a pointer outside it refused.
    let export = heap.export_ipc().unwrap();
    let imported = ImportedHeap::import(&gpu, &export.descriptor, export.fds).unwrap();
    assert!(matches!(
        imported.translate(heap.base() - 1),
        Err(Error::Ipc(_))
    ));
    let data = heap.base() + heap.geometry().data_offset;
    assert_eq!(
        imported.translate(data).unwrap(),
        imported.base() + heap.geometry().data_offset
    );
}
