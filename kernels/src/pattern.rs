//! The byte patterns tests write into every allocation: derived from the owner, so an overlap
//! between two live blocks shows up as a corrupted pattern when either is checked.

/// The pattern word for word `k` of the block owned by `owner` in round `tag`.
#[inline(always)]
pub fn word(owner: u64, tag: u32, k: usize) -> u32 {
    let h = (owner ^ (tag as u64) << 40).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    ((h >> 32) as u32) ^ (k as u32).wrapping_mul(0x85EB_CA6B)
}

/// Fill `len` bytes at `p` (4-byte aligned) with the pattern.
///
/// # Safety
/// `p` is valid for `len` bytes of writes and 4-byte aligned.
pub unsafe fn fill(p: *mut u8, len: usize, owner: u64, tag: u32) {
    let words = p as *mut u32;
    for k in 0..len / 4 {
        // SAFETY: inside the block (caller).
        unsafe { words.add(k).write_volatile(word(owner, tag, k)) };
    }
    for b in len / 4 * 4..len {
        // SAFETY: inside the block (caller).
        unsafe { p.add(b).write_volatile(word(owner, tag, b / 4) as u8) };
    }
}

/// Count bytes-or-words at `p` that differ from the pattern (0 means intact).
///
/// # Safety
/// `p` is valid for `len` bytes of reads and 4-byte aligned.
pub unsafe fn check(p: *const u8, len: usize, owner: u64, tag: u32) -> u64 {
    let words = p as *const u32;
    let mut bad = 0;
    for k in 0..len / 4 {
        // SAFETY: inside the block (caller).
        bad += (unsafe { words.add(k).read_volatile() } != word(owner, tag, k)) as u64;
    }
    for b in len / 4 * 4..len {
        // SAFETY: inside the block (caller).
        bad += (unsafe { p.add(b).read_volatile() } != word(owner, tag, b / 4) as u8) as u64;
    }
    bad
}
