//! Memory the processes of one host share: a `memfd`, mapped by its maker and reached by
//! other processes through `/proc/<pid>/fd/<fd>` (same user, same PID namespace). The
//! loader's home store keeps rows its host's ranks copy from in one
//! (`loader/store.rs`); a feeder keeps the files it holds in them, which its
//! clients on the same host map instead of receiving the bytes ([`crate::feed`]).

use std::ops::Range;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Arc;

use arrow_buffer::Buffer;

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
        let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Region::map(None, len, true);
        }
        // SAFETY: memfd_create returned a new descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: ftruncate on a descriptor we own.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Region::map(Some(fd), len, true)
    }

    /// Maps the region of another process of this host (its `memfd`, reached through
    /// `/proc/<pid>/fd/<fd>`), read-only. Only a meshfeed `memfd` is mapped (on another
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

impl Drop for Region {
    fn drop(&mut self) {
        if self.len > 0 {
            // SAFETY: unmaps exactly the mapping made in `map`; no reference outlives self.
            unsafe { libc::munmap(self.ptr.cast(), self.len) };
        }
    }
}
