//! The receiver's memory: one anonymous mapping, populated at start, holding `slots` frame
//! slots of `slot_bytes` each between two guard regions filled with a known pattern. Nothing
//! is allocated after start; the guards let tests prove no datagram wrote outside a buffer.

use std::io;

/// Guard region size on each side of the slots.
pub const GUARD_BYTES: usize = 4096;
/// Byte pattern of the guard regions.
pub const GUARD_PATTERN: u8 = 0xdb;

pub struct Arena {
    base: *mut u8,
    map_len: usize,
    slot_bytes: usize,
    slots: usize,
}

// SAFETY: the mapping lives as long as the Arena; which thread may touch which slot is
// decided by the slot state machine in `placement` (receive thread while Free/Filling,
// consumer while Handed), never by the Arena itself.
unsafe impl Send for Arena {}
// SAFETY: as for Send: shared access only hands out pointers and, through the unsafe
// `slot`, slices whose callers vouch that nothing writes them.
unsafe impl Sync for Arena {}

impl Arena {
    pub fn new(slots: usize, slot_bytes: usize) -> io::Result<Arena> {
        let body = slots.checked_mul(slot_bytes).ok_or_else(|| io::Error::other("ring size overflows"))?;
        let map_len = body + 2 * GUARD_BYTES;
        // SAFETY: anonymous private mapping, no fd.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let base = p.cast::<u8>();
        // Huge pages (where the kernel grants them) cut the TLB misses of the kernel's copy
        // into the ring. (Miri, which checks the tests for undefined behaviour, has no
        // madvise; the advice changes no semantics.)
        // SAFETY: advice on exactly the fresh mapping.
        #[cfg(not(miri))]
        unsafe {
            libc::madvise(p, map_len, libc::MADV_HUGEPAGE);
        }
        // SAFETY: the writes stay inside the fresh mapping. Writing every page now
        // pre-faults it, so the receive path never takes a page fault.
        unsafe {
            std::ptr::write_bytes(base, 0, map_len);
            std::ptr::write_bytes(base, GUARD_PATTERN, GUARD_BYTES);
            std::ptr::write_bytes(base.add(GUARD_BYTES + body), GUARD_PATTERN, GUARD_BYTES);
        }
        Ok(Arena { base, map_len, slot_bytes, slots })
    }

    /// Bytes of the mapping the kernel backs with huge pages (AnonHugePages of its entry in
    /// /proc/self/smaps); `None` where that cannot be read.
    pub fn huge_bytes(&self) -> Option<usize> {
        let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
        let start = format!("{:x}-", self.base as usize);
        let mut lines = smaps.lines().skip_while(|l| !l.starts_with(&start));
        lines.next()?;
        // the first AnonHugePages after the entry's header line is the entry's own
        let kb = lines.find_map(|l| l.strip_prefix("AnonHugePages:"))?;
        Some(kb.trim().trim_end_matches("kB").trim().parse::<usize>().ok()? << 10)
    }

    pub fn slots(&self) -> usize {
        self.slots
    }

    pub fn slot_bytes(&self) -> usize {
        self.slot_bytes
    }

    /// Start of slot `i`.
    ///
    /// # Panics
    /// When `i >= slots` (checked in release builds too: the pointer is written through).
    #[inline]
    pub fn slot_ptr(&self, i: usize) -> *mut u8 {
        assert!(i < self.slots, "slot {i} of a {}-slot ring", self.slots);
        // SAFETY: i < slots, so the offset lies inside the mapping (guard + slots).
        unsafe { self.base.add(GUARD_BYTES + i * self.slot_bytes) }
    }

    /// Whether `p .. p + len` lies inside the slot area.
    #[inline]
    pub fn contains(&self, p: *const u8, len: usize) -> bool {
        let lo = self.base as usize + GUARD_BYTES;
        let hi = lo + self.slots * self.slot_bytes;
        (p as usize) >= lo && (p as usize).saturating_add(len) <= hi
    }

    /// The bytes of slot `i` (panics when `i >= slots`).
    ///
    /// # Safety
    /// Nothing may write the slot while the slice lives (the caller owns the slot).
    pub unsafe fn slot(&self, i: usize) -> &[u8] {
        // SAFETY: slot_ptr checks i; the slot's bytes lie inside the mapping and were
        // initialised at start; the caller guarantees no writer.
        unsafe { std::slice::from_raw_parts(self.slot_ptr(i), self.slot_bytes) }
    }

    /// True when both guard regions still hold only the guard pattern.
    pub fn guards_intact(&self) -> bool {
        let body = self.slots * self.slot_bytes;
        // SAFETY: reads of the guard ranges inside the mapping; nothing writes them.
        unsafe {
            let lo = std::slice::from_raw_parts(self.base, GUARD_BYTES);
            let hi = std::slice::from_raw_parts(self.base.add(GUARD_BYTES + body), GUARD_BYTES);
            lo.iter().chain(hi).all(|&b| b == GUARD_PATTERN)
        }
    }
}

impl Drop for Arena {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly the mapping created in `new`; no slice outlives self.
        unsafe {
            libc::munmap(self.base.cast(), self.map_len);
        }
    }
}
