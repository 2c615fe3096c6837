//! Safe RAII wrappers over the UCP handles: a [`Worker`] (which owns its context and its
//! endpoints) and the [`Request`]s posted on it. No raw handle leaves this module.
//!
//! Lifetimes. A worker closes its endpoints, then destroys its handle, then its context, in
//! that order, in `Drop`. A request belongs to the worker it was posted on and must be
//! dropped before that worker (or leaked): posting is `unsafe` and states this in its
//! contract; the transport keeps it by owning every request in a value that borrows the
//! worker or is declared before it.
//!
//! Buffers. A request reads or writes a buffer it does not own. Dropping a request only
//! hands it back to UCX (`ucp_request_free`, allowed in any state); the operation itself
//! goes on until it completes. So whoever owns a buffer must not free it while a request
//! on it is incomplete: cancel, then [`settle`] (progress until completion or a deadline),
//! and leak the buffer if that fails. The transport's owners of requests do exactly that.
//!
//! None of these types is `Send`: a lone request or worker moved to another thread would
//! split what one thread must use together. The transport, which owns a worker with every
//! request posted on it, is `Send` as a whole.

use std::cell::Cell;
use std::ffi::{c_void, CString};
use std::fmt;
use std::time::{Duration, Instant};

use ucx_sys as sys;

use crate::error::{Error, Result};

/// How long closing a worker's endpoints may take before the worker is destroyed anyway.
const CLOSE_DEADLINE: Duration = Duration::from_secs(2);

/// Text of a UCX status.
pub fn status_text(status: sys::ucs_status_t) -> String {
    // SAFETY: ucs_status_string returns a pointer to a static NUL-terminated string for
    // every status value.
    unsafe { std::ffi::CStr::from_ptr(sys::ucs_status_string(status)) }.to_string_lossy().into_owned()
}

/// The (major, minor) version of the UCX library this process runs with.
pub fn ucx_version() -> (u32, u32) {
    let (mut major, mut minor, mut release) = (0, 0, 0);
    // SAFETY: ucp_get_version only writes the three integers it is given.
    unsafe { sys::ucp_get_version(&mut major, &mut minor, &mut release) };
    (major, minor)
}

fn check(status: sys::ucs_status_t, what: &str) -> Result<()> {
    match status {
        sys::ucs_status_t::UCS_OK => Ok(()),
        s => Err(Error::Transport(format!("UCX {what}: {}", status_text(s)))),
    }
}

/// The status an operation ended with, other than success.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Failure(sys::ucs_status_t);

impl Failure {
    /// The message was longer than the receive buffer.
    pub fn is_truncation(self) -> bool {
        self.0 == sys::ucs_status_t::UCS_ERR_MESSAGE_TRUNCATED
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&status_text(self.0))
    }
}

/// A UCP context (`ucp_context_h`) with the tag-matching feature. Owned by its one worker.
struct Context {
    h: sys::ucp_context_h,
}

impl Context {
    /// Reads UCX's configuration from the environment (`UCX_*`, UCX's own settings),
    /// overriding `UCX_TLS` with `tls` when given.
    fn new(tls: Option<&str>) -> Result<Context> {
        let mut config: *mut sys::ucp_config_t = std::ptr::null_mut();
        // SAFETY: null prefix/file mean "environment only"; `config` is a valid out-pointer.
        check(unsafe { sys::ucp_config_read(std::ptr::null(), std::ptr::null(), &mut config) }, "config_read")?;
        let result = (|| {
            if let Some(tls) = tls {
                let name = CString::new("TLS").map_err(|_| Error::Config("bad UCX option name".into()))?;
                let value =
                    CString::new(tls).map_err(|_| Error::Config(format!("UCX transports {tls:?} contain a NUL")))?;
                // SAFETY: `config` was returned by ucp_config_read and is released below;
                // both strings are NUL-terminated and outlive the call.
                check(unsafe { sys::ucp_config_modify(config, name.as_ptr(), value.as_ptr()) }, "config_modify(TLS)")?;
            }
            let params = sys::ucp_params_t {
                field_mask: sys::ucp_params_field_UCP_PARAM_FIELD_FEATURES as u64,
                features: sys::ucp_feature_UCP_FEATURE_TAG as u64,
                ..Default::default()
            };
            let mut h: sys::ucp_context_h = std::ptr::null_mut();
            // SAFETY: `params` and `config` are valid for the call; ucp_init is a static
            // inline wrapper of ucp_init_version with the header's API version.
            check(
                unsafe { sys::ucp_init_version(sys::UCP_API_MAJOR, sys::UCP_API_MINOR, &params, config, &mut h) },
                "init",
            )?;
            Ok(Context { h })
        })();
        // SAFETY: `config` came from ucp_config_read and is not used after this.
        unsafe { sys::ucp_config_release(config) };
        result
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: `h` is a live context; its one worker (the only owner of the context) has
        // been destroyed in Worker::drop before its fields, this one included, are dropped.
        unsafe { sys::ucp_cleanup(self.h) }
    }
}

/// Records the first error UCX reports for an endpoint (peer failure).
unsafe extern "C" fn on_endpoint_error(arg: *mut c_void, _ep: sys::ucp_ep_h, status: sys::ucs_status_t) {
    // SAFETY: `arg` is the boxed cell of an Endpoint, which its worker frees only after the
    // worker handle is destroyed (Worker::drop), so after UCX's last callback. UCX calls
    // back from progress on the thread that uses the worker, so the Cell is not shared.
    let cell = unsafe { &*(arg as *const Cell<Option<sys::ucs_status_t>>) };
    if cell.get().is_none() {
        cell.set(Some(status));
    }
}

/// An endpoint to one peer's worker. No `Drop`: its worker closes it (Worker::drop).
struct Endpoint {
    h: sys::ucp_ep_h,
    /// Written by `on_endpoint_error`; boxed so that its address is stable.
    error: Box<Cell<Option<sys::ucs_status_t>>>,
}

/// A UCP worker (`ucp_worker_h`) in serialized thread mode, with its own context and its
/// endpoints to the peers of one group, indexed by rank in the group.
pub struct Worker {
    // Field order is drop order, after Worker::drop has closed the endpoints and destroyed
    // the handle: the endpoints' error cells, then the context.
    endpoints: Vec<Option<Endpoint>>,
    h: sys::ucp_worker_h,
    _context: Context,
}

impl Worker {
    /// Creates a context (UCX's settings from `UCX_*`, `UCX_TLS` overridden by `tls`) and
    /// a worker on it. The worker is serialized: any one thread at a time may use it
    /// (single-threaded workers may only be used by the thread that created them).
    pub fn new(tls: Option<&str>) -> Result<Worker> {
        let context = Context::new(tls)?;
        let params = sys::ucp_worker_params_t {
            field_mask: sys::ucp_worker_params_field_UCP_WORKER_PARAM_FIELD_THREAD_MODE as u64,
            thread_mode: sys::ucs_thread_mode_t_UCS_THREAD_MODE_SERIALIZED,
            ..Default::default()
        };
        let mut h: sys::ucp_worker_h = std::ptr::null_mut();
        // SAFETY: `context.h` is live; `params` is valid for the call.
        check(unsafe { sys::ucp_worker_create(context.h, &params, &mut h) }, "worker_create")?;
        let worker = Worker { endpoints: Vec::new(), h, _context: context };
        // UCX may grant a weaker mode than asked (a build without --enable-mt does).
        let mut attr = sys::ucp_worker_attr_t {
            field_mask: sys::ucp_worker_attr_field_UCP_WORKER_ATTR_FIELD_THREAD_MODE as u64,
            ..Default::default()
        };
        // SAFETY: `worker.h` is live; `attr` is a valid out-parameter with its field mask.
        check(unsafe { sys::ucp_worker_query(worker.h, &mut attr) }, "worker_query")?;
        if attr.thread_mode == sys::ucs_thread_mode_t_UCS_THREAD_MODE_SINGLE {
            return Err(Error::Transport(
                "UCX granted only a single-threaded worker (a UCX built without --enable-mt?); \
                 meshfeed needs a serialized worker to move transports between threads"
                    .into(),
            ));
        }
        Ok(worker)
    }

    /// The worker's address, to publish to peers.
    pub fn address(&self) -> Result<Vec<u8>> {
        let mut addr: *mut sys::ucp_address_t = std::ptr::null_mut();
        let mut len = 0usize;
        // SAFETY: `h` is live; out-pointers are valid.
        check(unsafe { sys::ucp_worker_get_address(self.h, &mut addr, &mut len) }, "worker_get_address")?;
        // SAFETY: UCX returned `len` readable bytes at `addr`; they are copied before release.
        let bytes = unsafe { std::slice::from_raw_parts(addr as *const u8, len) }.to_vec();
        // SAFETY: `addr` was returned by ucp_worker_get_address on this worker.
        unsafe { sys::ucp_worker_release_address(self.h, addr) };
        Ok(bytes)
    }

    /// Connects one endpoint to every group rank but `me`, whose worker addresses are
    /// `addresses` (in group rank order). With `peer_errors`, UCX reports peer failures
    /// (error handling mode PEER); UCX then only selects transports that support it, which
    /// excludes shared memory (posix, sysv, cma).
    pub fn connect(&mut self, addresses: &[&[u8]], me: usize, peer_errors: bool) -> Result<()> {
        for (r, address) in addresses.iter().enumerate() {
            if r == me {
                self.endpoints.push(None);
                continue;
            }
            if address.is_empty() {
                return Err(Error::Transport(format!("group rank {r} published an empty UCX worker address")));
            }
            let error = Box::new(Cell::new(None));
            let params = sys::ucp_ep_params_t {
                field_mask: (sys::ucp_ep_params_field_UCP_EP_PARAM_FIELD_REMOTE_ADDRESS
                    | sys::ucp_ep_params_field_UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE
                    | sys::ucp_ep_params_field_UCP_EP_PARAM_FIELD_ERR_HANDLER) as u64,
                address: address.as_ptr() as *const sys::ucp_address_t,
                err_mode: if peer_errors {
                    sys::ucp_err_handling_mode_t_UCP_ERR_HANDLING_MODE_PEER
                } else {
                    sys::ucp_err_handling_mode_t_UCP_ERR_HANDLING_MODE_NONE
                },
                err_handler: sys::ucp_err_handler_t {
                    cb: Some(on_endpoint_error),
                    arg: &*error as *const _ as *mut c_void,
                },
                ..Default::default()
            };
            let mut h: sys::ucp_ep_h = std::ptr::null_mut();
            // SAFETY: the worker is live; `address` holds a worker address received from
            // the peer and outlives the call (UCX copies what it needs); the error cell's
            // address is stable (boxed) and it lives until after the worker is destroyed.
            check(unsafe { sys::ucp_ep_create(self.h, &params, &mut h) }, "ep_create")?;
            // Stored at once, so that Worker::drop closes it whatever fails next.
            self.endpoints.push(Some(Endpoint { h, error }));
        }
        Ok(())
    }

    /// The failure UCX reported for group rank `peer`, if any.
    pub fn failure(&self, peer: usize) -> Option<String> {
        self.endpoints.get(peer)?.as_ref()?.error.get().map(status_text)
    }

    /// Drives communication; returns whether anything happened.
    pub fn progress(&self) -> bool {
        // SAFETY: `h` is live; the worker is used by one thread at a time (serialized mode:
        // the transport that owns it is not Sync).
        unsafe { sys::ucp_worker_progress(self.h) != 0 }
    }

    /// Posts a tagged send of the `len` bytes at `buf` to group rank `peer`.
    ///
    /// # Safety
    /// The `len` bytes at `buf` must stay allocated and unmodified until the request
    /// completes (or forever, if it never does), and the request must be dropped before
    /// this worker, or leaked (`mem::forget`, never used again).
    pub unsafe fn send(&self, peer: usize, buf: *const u8, len: usize, tag: u64) -> Result<Request> {
        let ep = match self.endpoints.get(peer) {
            Some(Some(ep)) => ep,
            _ => return Err(Error::Transport(format!("no UCX endpoint to group rank {peer}"))),
        };
        let param = sys::ucp_request_param_t::default();
        // SAFETY: the endpoint and worker are live; the caller keeps the buffer alive until
        // the request completes.
        let ptr = unsafe { sys::ucp_tag_send_nbx(ep.h, buf as *const c_void, len, tag, &param) };
        Request::new(ptr, self.h, false, "tag_send")
    }

    /// Posts a tagged receive of at most `len` bytes into `buf`, matching `tag` exactly.
    ///
    /// # Safety
    /// The `len` bytes at `buf` must stay allocated and be neither read nor written until
    /// the request completes (or ever, if it never does), and the request must be dropped
    /// before this worker, or leaked (`mem::forget`, never used again).
    pub unsafe fn recv(&self, buf: *mut u8, len: usize, tag: u64) -> Result<Request> {
        // Always a request, never an immediate completion: the received length is read
        // from the request (`received`). UCX 1.13 does not fill `recv_info` when a
        // receive completes at once, although its documentation says so.
        let param = sys::ucp_request_param_t {
            op_attr_mask: sys::ucp_op_attr_t_UCP_OP_ATTR_FLAG_NO_IMM_CMPL,
            ..Default::default()
        };
        // SAFETY: the worker is live; the caller keeps the buffer alive until completion.
        let ptr = unsafe { sys::ucp_tag_recv_nbx(self.h, buf as *mut c_void, len, tag, u64::MAX, &param) };
        Request::new(ptr, self.h, true, "tag_recv")
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        // Close every endpoint at once (a forced close cancels what is outstanding on it),
        // wait for the closes with a deadline, then destroy the worker.
        let param = sys::ucp_request_param_t {
            op_attr_mask: sys::ucp_op_attr_t_UCP_OP_ATTR_FIELD_FLAGS,
            flags: sys::ucp_ep_close_flags_t_UCP_EP_CLOSE_FLAG_FORCE,
            ..Default::default()
        };
        let mut closing = Vec::new();
        for ep in self.endpoints.iter().flatten() {
            // SAFETY: `ep.h` is a live endpoint of this worker, closed exactly once (here).
            let ptr = unsafe { sys::ucp_ep_close_nbx(ep.h, &param) };
            if let Ok(request) = Request::new(ptr, self.h, false, "ep_close") {
                closing.push(request);
            }
        }
        drain(&mut closing, Instant::now() + CLOSE_DEADLINE);
        // Close requests still pending are handed back to UCX (allowed in any state; they
        // own no buffer of ours) before the worker goes.
        drop(closing);
        // SAFETY: `h` is live; every request posted on it has been dropped or leaked for
        // good (the contract of `send`/`recv`; the close requests just above). The
        // endpoints' error cells are freed only after this, with the `endpoints` field.
        unsafe { sys::ucp_worker_destroy(self.h) }
    }
}

/// A posted operation. Dropping it hands it back to UCX without cancelling it: the owner
/// of its buffer cancels and [`settle`]s it first (see the module docs).
pub struct Request {
    /// NULL: the operation completed when it was posted.
    ptr: *mut c_void,
    /// The worker it was posted on (not owned): for cancel and progress in [`settle`].
    worker: sys::ucp_worker_h,
    /// Whether this is a tag receive (whose received length can be asked for).
    is_recv: bool,
}

impl Request {
    fn new(ptr: sys::ucs_status_ptr_t, worker: sys::ucp_worker_h, is_recv: bool, what: &str) -> Result<Request> {
        if sys::ucs_ptr_is_err(ptr) {
            return Err(Error::Transport(format!("UCX {what}: {}", status_text(sys::ucs_ptr_status(ptr)))));
        }
        Ok(Request { ptr, worker, is_recv })
    }

    /// `Ok(true)` when complete, `Ok(false)` while in progress, `Err` on failure.
    pub fn test(&self) -> std::result::Result<bool, Failure> {
        if self.ptr.is_null() {
            return Ok(true);
        }
        // SAFETY: `ptr` is a live request handle (freed only in Drop).
        match unsafe { sys::ucp_request_check_status(self.ptr) } {
            sys::ucs_status_t::UCS_INPROGRESS => Ok(false),
            sys::ucs_status_t::UCS_OK => Ok(true),
            s => Err(Failure(s)),
        }
    }

    /// For a receive that completed successfully: the number of bytes received.
    pub fn received(&self) -> Option<usize> {
        // Receives are posted without immediate completion, so a receive always has a
        // request to ask.
        if !self.is_recv || self.ptr.is_null() {
            return None;
        }
        let mut info = sys::ucp_tag_recv_info_t::default();
        // SAFETY: `ptr` is a live tag-receive request (`is_recv`); `info` is a valid
        // out-parameter.
        match unsafe { sys::ucp_tag_recv_request_test(self.ptr, &mut info) } {
            sys::ucs_status_t::UCS_OK => Some(info.length),
            _ => None,
        }
    }

    /// Asks UCX to cancel the operation if it is still in progress. It then completes
    /// (cancelled, or done) after some progress; UCX may not cancel every kind of send.
    pub fn cancel(&self) {
        if matches!(self.test(), Ok(false)) {
            // SAFETY: `ptr` is a live, incomplete request of `worker`, which is live (the
            // contract of posting: requests are dropped before their worker).
            unsafe { sys::ucp_request_cancel(self.worker, self.ptr) };
        }
    }
}

impl Drop for Request {
    fn drop(&mut self) {
        if !self.ptr.is_null() {
            // SAFETY: `ptr` is a live request, freed exactly once. Freeing an incomplete
            // request is allowed: UCX completes the operation and then releases it.
            unsafe { sys::ucp_request_free(self.ptr) };
        }
    }
}

impl AsRef<Request> for Request {
    fn as_ref(&self) -> &Request {
        self
    }
}

/// Progresses the requests' worker until every request completed (successfully or not),
/// dropping completed ones, or until `deadline`. Returns whether none is left.
pub fn drain<R: AsRef<Request>>(requests: &mut Vec<R>, deadline: Instant) -> bool {
    loop {
        requests.retain(|r| matches!(r.as_ref().test(), Ok(false)));
        let Some(first) = requests.first() else {
            return true;
        };
        if Instant::now() >= deadline {
            return false;
        }
        // SAFETY: the worker of a live request is live (the contract of posting), and it
        // is used from this thread only (the owner of worker and request is not Sync).
        if unsafe { sys::ucp_worker_progress(first.as_ref().worker) } == 0 {
            std::thread::yield_now();
        }
    }
}

/// The cancellation half of the ownership rule: cancels every incomplete request and
/// [`drain`]s them until `deadline`. Returns whether none is left; when some are, their
/// buffers must be leaked with them.
pub fn settle<R: AsRef<Request>>(requests: &mut Vec<R>, deadline: Instant) -> bool {
    for r in requests.iter() {
        r.as_ref().cancel();
    }
    drain(requests, deadline)
}
