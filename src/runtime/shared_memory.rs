//! Memory the processes of one host share: a `memfd`, mapped by its maker and reached by
//! other processes through `/proc/<pid>/fd/<fd>` (same user, same PID namespace). The
//! loader's home store keeps rows its host's ranks copy from in one
//! (`loader/read/store.rs`); a feeder keeps the files it holds in them, which its
//! clients on the same host map instead of receiving the bytes ([`crate::feed`]).
//!
//! A region is sealed as soon as it is made ([`SEALS`]): its size is fixed, and nothing
//! can write to it but the mapping its maker holds — not a process that opens it through
//! `/proc` (as root too), not a writable mapping made later. Whoever maps another process's
//! region checks the seals first ([`Region::open_peer`]), so that no region anyone could
//! rewrite or truncate under its readers is ever read. (A process that may trace its maker,
//! the same user where ptrace is allowed, can still write the maker's memory: sealing
//! guards the region's file, not the maker's address space.)

use std::ops::Range;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Arc;

use arrow_buffer::Buffer;

/// The seals every region carries from its making: it neither shrinks (a reader's mapping
/// past the end would fault) nor grows, and no write reaches it but through its maker's
/// mapping (`F_SEAL_FUTURE_WRITE`: no `write`, no new writable mapping, no hole punched),
/// and no seal is added or taken after.
pub const SEALS: libc::c_int = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_FUTURE_WRITE | libc::F_SEAL_SEAL;

/// A memory region: a `memfd` mapped shared (other processes of the host map it too), or
/// anonymous memory where `memfd_create` is not available.
pub(crate) struct Region {
    ptr: *mut u8,
    len: usize,
    /// The memfd (`None`: anonymous memory, which cannot be shared).
    fd: Option<OwnedFd>,
    writable: bool,
}

// SAFETY: the region is plain memory. Its users write only bytes nobody reads yet, and
// publish them before anyone reads them (the home store's filler writes rows past its
// watermark; a feeder fills a file's region before serving it), so no byte is read while
// it is written; the pointer stays valid until Drop.
unsafe impl Send for Region {}
// SAFETY: as above.
unsafe impl Sync for Region {}

impl Region {
    /// A new zero-filled region of `len` bytes (memory is committed as it is written);
    /// `name` is what `/proc/<pid>/fd` shows of it.
    pub fn create(name: &std::ffi::CStr, len: usize) -> std::io::Result<Region> {
        // SAFETY: the name is a NUL-terminated C string; flags are valid.
        let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
        if fd < 0 {
            return Region::map(None, len, true);
        }
        // SAFETY: memfd_create returned a new descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: ftruncate on a descriptor we own.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        let region = Region::map(Some(fd), len, true)?;
        // Sealed once this process holds the one writable mapping there will be. A kernel
        // without the seals (before Linux 5.1) leaves it unsealed: peers then refuse to
        // map it and read through the socket or the files instead.
        // SAFETY: fcntl on a descriptor this region owns.
        let _ = unsafe { libc::fcntl(region.fd().expect("a memfd"), libc::F_ADD_SEALS, SEALS) };
        Ok(region)
    }

    /// Whether the region's file carries [`SEALS`] (what [`Region::open_peer`] checks).
    pub fn sealed(&self) -> bool {
        self.fd().is_some_and(|fd| seals_of(fd) & SEALS == SEALS)
    }

    /// Maps the region of another process of this host (its `memfd`, reached through
    /// `/proc/<pid>/fd/<fd>`), read-only. Only a sealed meshfeed `memfd` is mapped (one
    /// without [`SEALS`] could be rewritten or truncated under this process; on another
    /// host, or after that process ended, the descriptor may be anything, a FIFO whose
    /// open would block among them): the path is checked before it is opened, and what it
    /// opened after (a descriptor swapped in between is caught), and it is opened without
    /// blocking or becoming the controlling terminal. The mapping keeps the `memfd` alive;
    /// its descriptor here is closed at once.
    pub fn open_peer(pid: u32, fd: i32, len: usize) -> std::io::Result<Region> {
        use std::os::unix::fs::OpenOptionsExt;
        let path = format!("/proc/{pid}/fd/{fd}");
        let ours = |link: std::path::PathBuf| link.to_string_lossy().starts_with("/memfd:meshfeed-");
        let refuse = || std::io::Error::other(format!("{path} is not a meshfeed memory region"));
        if !ours(std::fs::read_link(&path)?) {
            return Err(refuse());
        }
        let file =
            std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY).open(&path)?;
        if !ours(std::fs::read_link(format!("/proc/self/fd/{}", file.as_raw_fd()))?) || !file.metadata()?.is_file() {
            return Err(refuse());
        }
        let seals = seals_of(file.as_raw_fd());
        if seals & SEALS != SEALS {
            return Err(std::io::Error::other(format!(
                "{path} is not sealed against writes and resizing (seals {seals:#x}): not mapped"
            )));
        }
        let have = file.metadata()?.len();
        if have < len as u64 {
            return Err(std::io::Error::other(format!("region of process {pid} holds {have} bytes, expected {len}")));
        }
        let mut region = Region::map(Some(OwnedFd::from(file)), len, false)?;
        region.fd = None;
        Ok(region)
    }

    fn map(fd: Option<OwnedFd>, len: usize, writable: bool) -> std::io::Result<Region> {
        if len == 0 {
            return Ok(Region { ptr: std::ptr::NonNull::dangling().as_ptr(), len, fd, writable });
        }
        let prot = libc::PROT_READ | if writable { libc::PROT_WRITE } else { 0 };
        let (flags, raw) = match &fd {
            Some(fd) => (libc::MAP_SHARED, fd.as_raw_fd()),
            None => (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE, -1),
        };
        // SAFETY: a fresh mapping of `len` bytes; the kernel picks the address.
        let ptr = unsafe { libc::mmap(std::ptr::null_mut(), len, prot, flags, raw, 0) };
        if ptr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Region { ptr: ptr.cast(), len, fd, writable })
    }

    /// The descriptor other processes open the region by, if it can be shared.
    pub fn fd(&self) -> Option<i32> {
        self.fd.as_ref().map(|f| f.as_raw_fd())
    }

    /// Its size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// The whole region as an Arrow buffer, which keeps it mapped while any chunk refers
    /// to it. The caller reads only published bytes.
    pub fn buffer(self: &Arc<Self>) -> Buffer {
        match std::ptr::NonNull::new(self.ptr) {
            // SAFETY: `ptr` maps `len` bytes, valid while the region lives, which the
            // buffer's owner (a clone of the Arc) ensures.
            Some(ptr) => unsafe { Buffer::from_custom_allocation(ptr, self.len, self.clone()) },
            None => Buffer::from_vec(Vec::<u8>::new()),
        }
    }

    /// Bytes `range` of the region. The caller reads only published bytes.
    pub fn bytes(&self, range: Range<usize>) -> &[u8] {
        assert!(range.start <= range.end && range.end <= self.len, "{range:?} of {} bytes", self.len);
        // SAFETY: in bounds (checked); published rows are never written again.
        unsafe { std::slice::from_raw_parts(self.ptr.add(range.start), range.end - range.start) }
    }

    /// Bytes `range` of the region to fill (bounds and writability checked).
    ///
    /// # Safety
    /// While the slice lives, no other slice of these bytes may exist: no thread reads
    /// them (they are not published yet) and no other writer fills them.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn bytes_to_fill(&self, range: Range<usize>) -> &mut [u8] {
        assert!(self.writable && range.end <= self.len && range.start <= range.end);
        // SAFETY: in bounds and writable (checked); exclusive (the caller's contract).
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(range.start), range.end - range.start) }
    }
}

/// The seals of the file `fd` (0 where it has none, or cannot have any).
fn seals_of(fd: libc::c_int) -> libc::c_int {
    // SAFETY: F_GET_SEALS reads a flag word of a descriptor the caller holds open.
    unsafe { libc::fcntl(fd, libc::F_GET_SEALS) }.max(0)
}

impl Drop for Region {
    fn drop(&mut self) {
        if self.len > 0 {
            // SAFETY: unmaps exactly the mapping made in `map`; no reference outlives self.
            unsafe { libc::munmap(self.ptr.cast(), self.len) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_region_cannot_be_written_resized_or_mapped_writable_through_its_file() {
        let region = Region::create(c"meshfeed-test", 1 << 16).unwrap();
        assert!(region.sealed());
        // SAFETY: nobody else sees these bytes yet.
        unsafe { region.bytes_to_fill(0..4) }.copy_from_slice(b"rows");
        let path = format!("/proc/self/fd/{}", region.fd().unwrap());
        // Anyone of this user (root too) opening it through /proc: no write, no resize...
        let file = std::fs::OpenOptions::new().read(true).write(true).open(&path).unwrap();
        let err = std::os::unix::fs::FileExt::write_at(&file, b"evil", 0).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EPERM), "{err}");
        for len in [0, 1 << 17] {
            let err = file.set_len(len).unwrap_err();
            assert_eq!(err.raw_os_error(), Some(libc::EPERM), "{len}: {err}");
        }
        // ...no writable mapping...
        // SAFETY: a fresh mapping attempt; unmapped below if it was made.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                4096,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        assert_eq!(ptr, libc::MAP_FAILED, "a writable mapping of a sealed region was made");
        // ...no seal taken away (they cannot be) or added.
        // SAFETY: fcntl on an open descriptor.
        assert_eq!(unsafe { libc::fcntl(file.as_raw_fd(), libc::F_ADD_SEALS, libc::F_SEAL_WRITE) }, -1);
        // Its maker still fills it, and a peer reads what it filled.
        // SAFETY: nobody reads these bytes yet.
        unsafe { region.bytes_to_fill(4..8) }.copy_from_slice(b"more");
        let peer = Region::open_peer(std::process::id(), region.fd().unwrap(), 1 << 16).unwrap();
        assert_eq!(peer.bytes(0..8), b"rowsmore");
    }

    #[test]
    fn a_peer_maps_no_region_that_is_not_sealed() {
        // A meshfeed-named memfd without seals (what an older meshfeed, or anyone, makes).
        // SAFETY: a NUL-terminated name and valid flags.
        let fd = unsafe { libc::memfd_create(c"meshfeed-feeder".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(fd >= 0);
        // SAFETY: memfd_create returned a descriptor nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: ftruncate on a descriptor we own.
        assert_eq!(unsafe { libc::ftruncate(fd.as_raw_fd(), 4096) }, 0);
        let err = Region::open_peer(std::process::id(), fd.as_raw_fd(), 4096).err().unwrap().to_string();
        assert!(err.contains("is not sealed against writes and resizing (seals 0x1): not mapped"), "{err}");
    }
}
